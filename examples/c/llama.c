/* A Llama forward pass in plain C99 whose KV cache lives in VeloxQuant caches (the C API).
 *
 * The C twin of examples/python/numpy_llama.py: it reads a llama2.c checkpoint and tokenizer
 * (run.c's formats), reads a text teacher-forced one token per step through one layer cache per
 * layer, passes its attention probabilities back to the cache, and prints the perplexity per
 * method. `veloxquant eval` on the same text, tokens and budget gives the same numbers up to
 * fp32 rounding order (tests/capi/llama_c_test.sh compares them).
 *
 *   llama_c_example MODEL TOKENIZER TEXT N_TOKENS BUDGET SPEC [SPEC...]
 *   prints one line per method: "<canonical spec> <perplexity> <kept>/<seen>"
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "veloxquant/veloxquant_c.h"

static void die(const char* what, const char* detail) {
  fprintf(stderr, "llama.c: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(1);
}

static void* xmalloc(size_t n) {
  void* p = calloc(n ? n : 1, 1);
  if (!p) die("out of memory", NULL);
  return p;
}

static char* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  char* data;
  long n;
  if (!f) die("cannot open", path);
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    die("cannot size", path);
  }
  data = xmalloc((size_t)n + 1);
  if (fread(data, 1, (size_t)n, f) != (size_t)n) die("cannot read", path);
  fclose(f);
  *size = (size_t)n;
  return data;
}

/* ---- The model (llama2.c legacy format) ------------------------------------------------- */

typedef struct {
  int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, head_dim;
  const float* embedding;         /* [vocab][dim] */
  const float* attn_norm;         /* [L][dim] */
  const float *wq, *wk, *wv, *wo; /* [L][Hq*D][dim], [L][Hkv*D][dim] x2, [L][dim][Hq*D] */
  const float* ffn_norm;          /* [L][dim] */
  const float *w1, *w2, *w3;      /* [L][hidden][dim], [L][dim][hidden], [L][hidden][dim] */
  const float* final_norm;        /* [dim] */
  const float* classifier;        /* [vocab][dim] */
  char* file;
} Model;

static void load_model(Model* m, const char* path) {
  size_t size, need;
  int32_t header[7];
  const float* w;
  int tied, kv_dim;
  m->file = read_file(path, &size);
  if (size < sizeof header) die("truncated checkpoint", path);
  memcpy(header, m->file, sizeof header);
  m->dim = header[0];
  m->hidden_dim = header[1];
  m->n_layers = header[2];
  m->n_heads = header[3];
  m->n_kv_heads = header[4];
  tied = header[5] > 0;
  m->vocab_size = abs(header[5]);
  m->seq_len = header[6];
  if (m->dim <= 0 || m->n_heads <= 0 || m->n_kv_heads <= 0 || m->dim % m->n_heads != 0 ||
      m->n_heads % m->n_kv_heads != 0 || m->n_layers <= 0 || m->seq_len <= 0) {
    die("not a llama2.c checkpoint", path);
  }
  m->head_dim = m->dim / m->n_heads;
  kv_dim = m->n_kv_heads * m->head_dim;
  need = (size_t)m->vocab_size * m->dim +
         (size_t)m->n_layers * (2u * m->dim + (size_t)m->dim * m->dim * 2 +
                                (size_t)kv_dim * m->dim * 2 + (size_t)m->hidden_dim * m->dim * 3) +
         m->dim + (size_t)m->seq_len * m->head_dim + (tied ? 0 : (size_t)m->vocab_size * m->dim);
  if (size < sizeof header + need * sizeof(float)) die("truncated checkpoint", path);
  /* The weights follow the 28-byte header; memcpy-free access needs 4-byte alignment, which
   * calloc's buffer + 28 has. */
  w = (const float*)(m->file + sizeof header);
  m->embedding = w;
  w += (size_t)m->vocab_size * m->dim;
  m->attn_norm = w;
  w += (size_t)m->n_layers * m->dim;
  m->wq = w;
  w += (size_t)m->n_layers * m->dim * m->dim;
  m->wk = w;
  w += (size_t)m->n_layers * kv_dim * m->dim;
  m->wv = w;
  w += (size_t)m->n_layers * kv_dim * m->dim;
  m->wo = w;
  w += (size_t)m->n_layers * m->dim * m->dim;
  m->ffn_norm = w;
  w += (size_t)m->n_layers * m->dim;
  m->w1 = w;
  w += (size_t)m->n_layers * m->hidden_dim * m->dim;
  m->w2 = w;
  w += (size_t)m->n_layers * m->dim * m->hidden_dim;
  m->w3 = w;
  w += (size_t)m->n_layers * m->hidden_dim * m->dim;
  m->final_norm = w;
  w += m->dim;
  w += (size_t)m->seq_len * m->head_dim; /* the legacy RoPE tables (unused) */
  m->classifier = tied ? m->embedding : w;
}

/* ---- The tokenizer (run.c's tokenizer.bin and encode) ------------------------------------ */

typedef struct {
  char** pieces; /* [vocab] NUL-terminated */
  float* scores; /* [vocab] */
  int* sorted;   /* ids sorted by piece, for lookup */
  int n;
} Tokenizer;

static const Tokenizer* g_sort_tok;
static int by_piece(const void* a, const void* b) {
  return strcmp(g_sort_tok->pieces[*(const int*)a], g_sort_tok->pieces[*(const int*)b]);
}

static void load_tokenizer(Tokenizer* t, const char* path, int vocab) {
  size_t size, at = 4;
  char* data = read_file(path, &size);
  int i;
  t->n = vocab;
  t->pieces = xmalloc(sizeof(char*) * (size_t)vocab);
  t->scores = xmalloc(sizeof(float) * (size_t)vocab);
  t->sorted = xmalloc(sizeof(int) * (size_t)vocab);
  for (i = 0; i < vocab; ++i) {
    int32_t len;
    if (size - at < 8) die("truncated tokenizer", path);
    memcpy(&t->scores[i], data + at, 4);
    memcpy(&len, data + at + 4, 4);
    at += 8;
    if (len < 0 || size - at < (size_t)len) die("truncated tokenizer", path);
    t->pieces[i] = xmalloc((size_t)len + 1);
    memcpy(t->pieces[i], data + at, (size_t)len);
    at += (size_t)len;
    t->sorted[i] = i;
  }
  free(data);
  g_sort_tok = t;
  qsort(t->sorted, (size_t)vocab, sizeof(int), by_piece);
}

static int lookup(const Tokenizer* t, const char* s) {
  int lo = 0, hi = t->n - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2, c = strcmp(s, t->pieces[t->sorted[mid]]);
    if (c == 0) return t->sorted[mid];
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return -1;
}

/* The id of the merge of tokens a and b, or -1 (buf holds at least two pieces). */
static int pair_id(const Tokenizer* t, int a, int b, char* buf) {
  strcpy(buf, t->pieces[a]);
  strcat(buf, t->pieces[b]);
  return lookup(t, buf);
}

/* run.c's encode(text, bos=1, eos=0) of the NUL-terminated `text` into out (room for
 * strlen(text) + 2 ids); returns the count. Merges the best-scoring adjacent pair (leftmost on
 * ties) until none is a piece; the pair ids are cached and only a merge's neighbours change. */
static int encode(const Tokenizer* t, const char* text, int* out) {
  size_t max_piece = 0, len = strlen(text);
  char buf[8];
  char* pair;
  int* merged;
  int n = 0, i, str_len = 0;
  const char* c;
  for (i = 0; i < t->n; ++i)
    max_piece = strlen(t->pieces[i]) > max_piece ? strlen(t->pieces[i]) : max_piece;
  pair = xmalloc(2 * max_piece + 1);
  out[n++] = 1;                           /* BOS */
  if (len > 0) out[n++] = lookup(t, " "); /* run.c's dummy prefix */
  for (c = text; *c; ++c) {
    if ((*c & 0xC0) != 0x80) str_len = 0;
    buf[str_len++] = *c;
    buf[str_len] = '\0';
    if ((*(c + 1) & 0xC0) == 0x80 && str_len < 4) continue;
    {
      const int id = lookup(t, buf);
      if (id != -1) {
        out[n++] = id;
      } else {
        for (i = 0; i < str_len; ++i) out[n++] = (unsigned char)buf[i] + 3; /* byte fallback */
      }
    }
    str_len = 0;
  }
  merged = xmalloc(sizeof(int) * (size_t)(n > 1 ? n : 1));
  for (i = 0; i + 1 < n; ++i) merged[i] = pair_id(t, out[i], out[i + 1], pair);
  for (;;) {
    float best = -1e10f;
    int at = -1;
    for (i = 0; i + 1 < n; ++i) {
      if (merged[i] != -1 && t->scores[merged[i]] > best) {
        best = t->scores[merged[i]];
        at = i;
      }
    }
    if (at == -1) break;
    out[at] = merged[at];
    memmove(out + at + 1, out + at + 2, sizeof(int) * (size_t)(n - at - 2));
    memmove(merged + at + 1, merged + at + 2, sizeof(int) * (size_t)(n > at + 2 ? n - at - 2 : 0));
    --n;
    if (at > 0) merged[at - 1] = pair_id(t, out[at - 1], out[at], pair);
    if (at + 1 < n) merged[at] = pair_id(t, out[at], out[at + 1], pair);
  }
  free(merged);
  free(pair);
  return n;
}

/* The first `want` tokens of the text (fewer if it has fewer), encoding growing prefixes (16
 * bytes per wanted token, doubling) until two successive prefixes agree on them, as the engine
 * does (engine/tokenizer.h encode_first). */
static int encode_first(const Tokenizer* t, const char* text, size_t text_len, int want, int* out) {
  size_t cut = (size_t)want * 16;
  int* prev = NULL;
  int n_prev = 0;
  for (;;) {
    const size_t take = cut < text_len ? cut : text_len;
    char* prefix = xmalloc(take + 1);
    int* ids = xmalloc(sizeof(int) * (take + 2));
    int n;
    memcpy(prefix, text, take);
    n = encode(t, prefix, ids);
    free(prefix);
    if (n > want) n = want;
    if (take == text_len ||
        (prev && n_prev == n && memcmp(prev, ids, sizeof(int) * (size_t)n) == 0)) {
      memcpy(out, ids, sizeof(int) * (size_t)n);
      free(ids);
      free(prev);
      return n;
    }
    free(prev);
    prev = ids;
    n_prev = n;
    cut *= 2;
  }
}

/* ---- The forward pass over VeloxQuant caches --------------------------------------------- */

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu,
           mantissa = h & 0x3ffu;
  uint32_t bits;
  float f;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      int shift = 0;
      while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        ++shift;
      }
      bits = sign | ((uint32_t)(127 - 14 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  memcpy(&f, &bits, sizeof f);
  return f;
}

static void load_row(const vq_head_rows* r, const void* base, int64_t row, int D, float* out) {
  int d;
  if (r->dtype == VQ_DTYPE_F32) {
    memcpy(out, (const float*)base + row * r->row_stride, sizeof(float) * (size_t)D);
  } else {
    const uint16_t* p = (const uint16_t*)base + row * r->row_stride;
    for (d = 0; d < D; ++d) out[d] = half_to_float(p[d]);
  }
}

static void rmsnorm(float* out, const float* x, const float* w, int n) {
  float ss = 0.0f;
  int i;
  for (i = 0; i < n; ++i) ss += x[i] * x[i];
  ss = 1.0f / sqrtf(ss / (float)n + 1e-5f);
  for (i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

/* out[i] = sum_j w[i][j] x[j], w [d][n] */
static void matmul(float* out, const float* x, const float* w, int n, int d) {
  int i, j;
  for (i = 0; i < d; ++i) {
    float s = 0.0f;
    for (j = 0; j < n; ++j) s += w[(size_t)i * n + j] * x[j];
    out[i] = s;
  }
}

/* run.c's RoPE: pairs (2i, 2i+1) of each head rotate by pos * 10000^(-2i/D), in fp32. */
static void rope(float* x, int n_heads, int D, int pos) {
  int h, i;
  for (h = 0; h < n_heads; ++h) {
    for (i = 0; i < D; i += 2) {
      const float freq = 1.0f / powf(10000.0f, (float)i / (float)D);
      const float angle = (float)pos * freq, c = cosf(angle), s = sinf(angle);
      float* v = x + h * D + i;
      const float x0 = v[0], x1 = v[1];
      v[0] = x0 * c - x1 * s;
      v[1] = x0 * s + x1 * c;
    }
  }
}

typedef struct {
  float *x, *xb, *xb2, *q, *k, *v, *att_out, *hb, *hb2, *logits, *probs, *row;
} RunState;

/* Logits [vocab] of `token` at `pos`; layer l's K/V go through `caches` layer l. */
static const float* forward(const Model* m, RunState* s, vq_model_cache* caches, int token,
                            int pos) {
  const int dim = m->dim, D = m->head_dim, Hq = m->n_heads, Hkv = m->n_kv_heads, G = Hq / Hkv;
  const int kv_dim = Hkv * D, hid = m->hidden_dim;
  int l, h, g, i;
  int64_t r;
  memcpy(s->x, m->embedding + (size_t)token * dim, sizeof(float) * (size_t)dim);
  for (l = 0; l < m->n_layers; ++l) {
    vq_layer_cache* layer = NULL;
    vq_step_view view;
    /* The new row as [B=1, Hkv, S=1, D]. */
    const vq_tensor keys = {s->k, VQ_DTYPE_F32, {1, Hkv, 1, D}, {kv_dim, D, D, 1}};
    vq_tensor values = keys;
    vq_attention probs;
    values.data = s->v;
    rmsnorm(s->xb, s->x, m->attn_norm + (size_t)l * dim, dim);
    matmul(s->q, s->xb, m->wq + (size_t)l * dim * dim, dim, dim);
    matmul(s->k, s->xb, m->wk + (size_t)l * kv_dim * dim, dim, kv_dim);
    matmul(s->v, s->xb, m->wv + (size_t)l * kv_dim * dim, dim, kv_dim);
    rope(s->q, Hq, D, pos);
    rope(s->k, Hkv, D, pos);

    vq_model_cache_layer(caches, l, &layer);
    if (vq_layer_begin_step(layer, &keys, &values, &view) != VQ_OK) {
      die("begin_step", vq_layer_last_error(layer));
    }
    for (h = 0; h < Hkv; ++h) {
      vq_head_rows rows; /* the kept rows + this token's, pointing into the cache */
      vq_layer_view_head(layer, 0, h, &rows);
      for (g = 0; g < G; ++g) {
        const int qh = h * G + g;
        const float* q = s->q + qh * D;
        float* p = s->probs + (size_t)qh * view.n_rows; /* [Hq][R] */
        float* out = s->att_out + qh * D;
        float top = -INFINITY, sum = 0.0f;
        for (r = 0; r < rows.n_rows; ++r) {
          float dot = 0.0f;
          load_row(&rows, rows.keys, r, D, s->row);
          for (i = 0; i < D; ++i) dot += q[i] * s->row[i];
          p[r] = dot / sqrtf((float)D);
          top = p[r] > top ? p[r] : top;
        }
        for (r = 0; r < rows.n_rows; ++r) {
          p[r] = expf(p[r] - top);
          sum += p[r];
        }
        for (i = 0; i < D; ++i) out[i] = 0.0f;
        /* A head with fewer rows than R (head-wise budgets): its other columns are 0. */
        for (r = rows.n_rows; r < view.n_rows; ++r) p[r] = 0.0f;
        for (r = 0; r < rows.n_rows; ++r) {
          p[r] /= sum;
          load_row(&rows, rows.values, r, D, s->row);
          for (i = 0; i < D; ++i) out[i] += p[r] * s->row[i];
        }
      }
    }
    /* The probabilities [B=1, Hq, S=1, R] go back to the cache. */
    probs.data = s->probs;
    probs.batch = 1;
    probs.n_query_heads = Hq;
    probs.n_queries = 1;
    probs.n_rows = view.n_rows;
    if (vq_layer_end_step(layer, &probs) != VQ_OK) die("end_step", vq_layer_last_error(layer));

    matmul(s->xb2, s->att_out, m->wo + (size_t)l * dim * dim, dim, dim);
    for (i = 0; i < dim; ++i) s->x[i] += s->xb2[i];
    rmsnorm(s->xb, s->x, m->ffn_norm + (size_t)l * dim, dim);
    matmul(s->hb, s->xb, m->w1 + (size_t)l * hid * dim, dim, hid);
    matmul(s->hb2, s->xb, m->w3 + (size_t)l * hid * dim, dim, hid);
    for (i = 0; i < hid; ++i) s->hb[i] = s->hb[i] / (1.0f + expf(-s->hb[i])) * s->hb2[i];
    matmul(s->xb, s->hb, m->w2 + (size_t)l * dim * hid, hid, dim);
    for (i = 0; i < dim; ++i) s->x[i] += s->xb[i];
  }
  rmsnorm(s->xb, s->x, m->final_norm, dim);
  matmul(s->logits, s->xb, m->classifier, dim, m->vocab_size);
  return s->logits;
}

int main(int argc, char** argv) {
  Model m;
  Tokenizer tok;
  RunState s;
  size_t text_len;
  char* text;
  int *tokens, n_tokens, want, a;
  long budget;
  if (argc < 7) {
    fprintf(stderr, "usage: %s MODEL TOKENIZER TEXT N_TOKENS BUDGET SPEC [SPEC...]\n", argv[0]);
    return 2;
  }
  if (vq_abi_version() != VQ_ABI_VERSION) die("libveloxquant ABI differs from the header", NULL);
  load_model(&m, argv[1]);
  load_tokenizer(&tok, argv[2], m.vocab_size);
  text = read_file(argv[3], &text_len);
  text[text_len] = '\0';
  text_len = strlen(text); /* as run.c: up to the first NUL */
  want = atoi(argv[4]);
  budget = atol(argv[5]);
  if (want < 2 || want > m.seq_len) die("N_TOKENS must be in [2, seq_len]", argv[4]);
  tokens = xmalloc(sizeof(int) * (size_t)want);
  n_tokens = encode_first(&tok, text, text_len, want, tokens);

  s.x = xmalloc(sizeof(float) * (size_t)m.dim);
  s.xb = xmalloc(sizeof(float) * (size_t)m.dim);
  s.xb2 = xmalloc(sizeof(float) * (size_t)m.dim);
  s.q = xmalloc(sizeof(float) * (size_t)m.dim);
  s.k = xmalloc(sizeof(float) * (size_t)(m.n_kv_heads * m.head_dim));
  s.v = xmalloc(sizeof(float) * (size_t)(m.n_kv_heads * m.head_dim));
  s.att_out = xmalloc(sizeof(float) * (size_t)m.dim);
  s.hb = xmalloc(sizeof(float) * (size_t)m.hidden_dim);
  s.hb2 = xmalloc(sizeof(float) * (size_t)m.hidden_dim);
  s.logits = xmalloc(sizeof(float) * (size_t)m.vocab_size);
  s.probs = xmalloc(sizeof(float) * (size_t)m.n_heads * (size_t)m.seq_len);
  s.row = xmalloc(sizeof(float) * (size_t)m.head_dim);

  for (a = 6; a < argc; ++a) {
    vq_error* error = NULL;
    vq_config* config = NULL;
    vq_model_cache* caches = NULL;
    const vq_model_shape shape = {m.n_layers, m.n_kv_heads, m.head_dim, m.n_heads};
    const char* spec = NULL;
    int64_t has_budget;
    double nll = 0.0;
    vq_cache_stats stats;
    int pos, i;
    if (vq_config_parse(argv[a], &config, &error) != VQ_OK) die(argv[a], vq_error_message(error));
    if (vq_config_token_budget(config, &has_budget) == VQ_OK &&
        vq_config_set_token_budget(config, budget) != VQ_OK) {
      die(argv[a], vq_config_last_error(config));
    }
    if (vq_model_cache_create(config, &shape, &caches, &error) != VQ_OK) {
      die(argv[a], vq_error_message(error));
    }
    for (pos = 0; pos + 1 < n_tokens; ++pos) {
      const float* logits = forward(&m, &s, caches, tokens[pos], pos);
      double top = logits[0], z = 0.0;
      for (i = 1; i < m.vocab_size; ++i) top = logits[i] > top ? logits[i] : top;
      for (i = 0; i < m.vocab_size; ++i) z += exp((double)logits[i] - top);
      nll += top + log(z) - (double)logits[tokens[pos + 1]];
    }
    vq_model_cache_stats(caches, &stats);
    vq_config_spec(config, 0, &spec);
    printf("%s %.9f %lld/%lld\n", spec, exp(nll / (n_tokens - 1)), (long long)stats.tokens_kept,
           (long long)stats.tokens_seen);
    vq_model_cache_free(caches);
    vq_config_free(config);
  }
  for (a = 0; a < tok.n; ++a) free(tok.pieces[a]);
  free(tok.pieces);
  free(tok.scores);
  free(tok.sorted);
  free(s.x), free(s.xb), free(s.xb2), free(s.q), free(s.k), free(s.v), free(s.att_out);
  free(s.hb), free(s.hb2), free(s.logits), free(s.probs), free(s.row);
  free(text);
  free(tokens);
  free(m.file);
  return 0;
}
