/* llamacpp_driver: the llama.cpp side of scripts/crosscheck_llamacpp.sh, a small C program over
 * llama.h and the prebuilt libllama (npm package @node-llama-cpp/linux-x64).
 *
 *   llamacpp_driver tokenize MODEL.gguf TEXT_FILE          ids of the text (BOS per metadata)
 *   llamacpp_driver tokenize-tests MODEL.gguf INP_FILE     llama.cpp's tokenizer test format:
 *                                                          tests separated by a line
 *                                                          "__ggml_vocab_test__"; one line of
 *                                                          ids per test, no special tokens
 *   llamacpp_driver greedy   MODEL.gguf STEPS [KV]         BOS, then argmax until STEPS
 *                                                          positions or EOS; prints the ids
 *   llamacpp_driver nll      MODEL.gguf TEXT_FILE N [KV]   per-token -ln p(next) of the first N
 *                                                          tokens (one line each), then the mean
 *   llamacpp_driver quantize MODEL.gguf OUT.gguf TYPE      llama.cpp's quantizer; TYPE q4_0,
 *                                                          q4_1, q5_0, q5_1, q8_0, q2_k, q3_k_m,
 *                                                          q4_k_m, q5_k_m, q6_k or f16 (tensors
 *                                                          whose rows do not fit fall back as
 *                                                          llama.cpp decides)
 *   llamacpp_driver blocks   MODEL.gguf TYPE_ID N          the first N values of the first tensor
 *                                                          of ggml type TYPE_ID: raw blocks and
 *                                                          ggml's to_float, as hex
 *   llamacpp_driver dequant  MODEL.gguf                    per tensor "name type_id n_values hash":
 *                                                          ggml's to_float of every tensor,
 *                                                          hashed (FNV-1a 64 over the fp32 bits)
 *   llamacpp_driver bench    MODEL.gguf CTX THREADS KV N [WARMUP]
 *                                                          prefills CTX tokens (batches of 512),
 *                                                          runs WARMUP (default 2) untimed and N
 *                                                          timed greedy decode steps; prints the
 *                                                          prefill time and the median and mean
 *                                                          step (flash attention: llama.cpp's
 *                                                          default, auto)
 * KV is the KV cache type: f32 (default for greedy/nll), f16, q8_0 or q4_0. One thread unless given:
 * results are then independent of scheduling. Exit status 0 on success, 1 on errors (printed).
 * LLAMACPP_LIB_DIR names the folder of libllama and its CPU backend libraries (libggml-cpu-*.so;
 * ggml loads the variant that scores best on this CPU, so a folder holding only one variant
 * forces it). LLAMACPP_NO_REPACK=1 turns off the extra buffer types (model parameter
 * use_extra_bufts: the repacked and AMX weight layouts), as llama-cli's --no-repack does.
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

static void quiet_log(enum ggml_log_level level, const char* text, void* user) {
  (void)user;
  if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int die(const char* what) {
  fprintf(stderr, "llamacpp_driver: %s\n", what);
  return 1;
}

static enum ggml_type kv_type(const char* name) {
  if (strcmp(name, "f16") == 0) return GGML_TYPE_F16;
  if (strcmp(name, "q8_0") == 0) return GGML_TYPE_Q8_0;
  if (strcmp(name, "q4_0") == 0) return GGML_TYPE_Q4_0;
  if (strcmp(name, "f32") == 0) return GGML_TYPE_F32;
  fprintf(stderr, "llamacpp_driver: KV type must be f32, f16, q8_0 or q4_0, got '%s'\n", name);
  exit(1);
}

static struct llama_model* load_model(const char* path, int vocab_only) {
  struct llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.vocab_only = vocab_only;
  /* LLAMACPP_NO_REPACK=1: no extra buffer types, so the CPU backend keeps every weight in its
   * stored blocks and uses its plain vec_dot kernels: no run-time repacking of Q4_0 / Q4_K /
   * Q2_K into interleaved layouts, and (the sapphirerapids variant, on a CPU with AMX) no AMX
   * buffer for Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K / Q6_K. */
  const char* no_repack = getenv("LLAMACPP_NO_REPACK");
  if (no_repack && strcmp(no_repack, "1") == 0) mp.use_extra_bufts = false;
  return llama_model_load_from_file(path, mp);
}

/* flash < 0: the cross-check's choice (off unless the V cache is quantized, which needs it);
 * otherwise a llama_flash_attn_type (bench uses AUTO, llama.cpp's default). */
static struct llama_context* make_context_fa(struct llama_model* model, int n_ctx, int threads,
                                             enum ggml_type kv, int n_batch, int flash) {
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = (uint32_t)n_ctx;
  cp.n_batch = (uint32_t)n_batch;
  cp.n_ubatch = (uint32_t)n_batch;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.type_k = kv;
  cp.type_v = kv;
  /* Flash attention needs a quantized V cache; f32/f16 runs use the plain attention path. */
  cp.flash_attn_type = flash >= 0             ? (enum llama_flash_attn_type)flash
                       : kv == GGML_TYPE_Q8_0 || kv == GGML_TYPE_Q4_0 ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                                              : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = 1;
  return llama_init_from_model(model, cp);
}

static struct llama_context* make_context(struct llama_model* model, int n_ctx, int threads,
                                          enum ggml_type kv, int n_batch) {
  return make_context_fa(model, n_ctx, threads, kv, n_batch, -1);
}

static char* read_file(const char* path, long* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* buf = malloc((size_t)*size + 1);
  if (fread(buf, 1, (size_t)*size, f) != (size_t)*size) {
    fclose(f);
    free(buf);
    return NULL;
  }
  buf[*size] = 0;
  fclose(f);
  return buf;
}

static int tokenize_ex(const struct llama_vocab* vocab, const char* text, long len,
                       llama_token** out, int add_special) {
  int n = -llama_tokenize(vocab, text, (int32_t)len, NULL, 0, add_special, false);
  if (n < 0) n = -n; /* an empty result returns 0 */
  *out = malloc(sizeof(llama_token) * (size_t)(n + 1));
  return llama_tokenize(vocab, text, (int32_t)len, *out, n + 1, add_special, false);
}

static int tokenize(const struct llama_vocab* vocab, const char* text, long len,
                    llama_token** out) {
  return tokenize_ex(vocab, text, len, out, 1);
}

static int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: see the comment at the top of llamacpp_driver.c\n");
    return 2;
  }
  llama_log_set(quiet_log, NULL);
  /* The CPU backends are separate libraries next to libllama (one per instruction set). */
  const char* lib_dir = getenv("LLAMACPP_LIB_DIR");
  if (lib_dir) {
    ggml_backend_load_all_from_path(lib_dir);
  } else {
    ggml_backend_load_all();
  }
  llama_backend_init();
  const char* mode = argv[1];
  if (strcmp(mode, "dequant") == 0) {
    struct gguf_init_params gp = {true, NULL};
    struct gguf_context* g = gguf_init_from_file(argv[2], gp);
    if (!g) return die("gguf_init_from_file failed");
    long size = 0;
    char* bytes = read_file(argv[2], &size);
    if (!bytes) return die("cannot read the model file");
    const size_t base = gguf_get_data_offset(g);
    for (int64_t t = 0; t < gguf_get_n_tensors(g); ++t) {
      const enum ggml_type type = gguf_get_tensor_type(g, t);
      const struct ggml_type_traits* tr = ggml_get_type_traits(type);
      const size_t n_bytes = gguf_get_tensor_size(g, t);
      const int64_t n = (int64_t)(n_bytes / tr->type_size) * tr->blck_size;
      float* out = malloc(sizeof(float) * (size_t)n);
      const char* src = bytes + base + gguf_get_tensor_offset(g, t);
      if (type == GGML_TYPE_F32) {
        memcpy(out, src, sizeof(float) * (size_t)n);
      } else {
        tr->to_float(src, out, n);
      }
      uint64_t h = 1469598103934665603ull;
      const unsigned char* b = (const unsigned char*)out;
      for (size_t i = 0; i < sizeof(float) * (size_t)n; ++i) h = (h ^ b[i]) * 1099511628211ull;
      printf("%s %d %lld %016llx\n", gguf_get_tensor_name(g, t), (int)type, (long long)n,
             (unsigned long long)h);
      free(out);
    }
    return 0;
  }
  if (strcmp(mode, "blocks") == 0 && argc >= 5) {
    /* The first N values of the first tensor of type TYPE_ID: the raw blocks and ggml's
     * to_float of them, both as hex (fixtures for tests/test_ggml_fixtures.cpp). */
    struct gguf_init_params gp = {true, NULL};
    struct gguf_context* g = gguf_init_from_file(argv[2], gp);
    if (!g) return die("gguf_init_from_file failed");
    long size = 0;
    char* bytes = read_file(argv[2], &size);
    if (!bytes) return die("cannot read the model file");
    const int want = atoi(argv[3]);
    const int64_t n = atoll(argv[4]);
    const size_t base = gguf_get_data_offset(g);
    for (int64_t t = 0; t < gguf_get_n_tensors(g); ++t) {
      const enum ggml_type type = gguf_get_tensor_type(g, t);
      if ((int)type != want) continue;
      const struct ggml_type_traits* tr = ggml_get_type_traits(type);
      if (n % tr->blck_size != 0 || (size_t)(n / tr->blck_size) * tr->type_size > gguf_get_tensor_size(g, t))
        return die("N must be a multiple of the block size within the tensor");
      const size_t nb = (size_t)(n / tr->blck_size) * tr->type_size;
      const unsigned char* src = (const unsigned char*)bytes + base + gguf_get_tensor_offset(g, t);
      float* out = malloc(sizeof(float) * (size_t)n);
      tr->to_float(src, out, n);
      printf("tensor %s\ntype %d %s\nvalues %lld\nblocks ", gguf_get_tensor_name(g, t), (int)type,
             ggml_type_name(type), (long long)n);
      for (size_t i = 0; i < nb; ++i) printf("%02x", src[i]);
      printf("\nfloats ");
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        memcpy(&u, out + i, 4);
        printf("%08x", u);
      }
      printf("\n");
      free(out);
      return 0;
    }
    return die("no tensor of that type");
  }
  if (strcmp(mode, "quantize") == 0 && argc >= 5) {
    struct llama_model_quantize_params qp = llama_model_quantize_default_params();
    qp.nthread = 1;
    static const struct {
      const char* name;
      enum llama_ftype ftype;
    } kinds[] = {{"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},     {"q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},
                 {"q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},     {"q5_1", LLAMA_FTYPE_MOSTLY_Q5_1},
                 {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"q2_k", LLAMA_FTYPE_MOSTLY_Q2_K},
                 {"q3_k_m", LLAMA_FTYPE_MOSTLY_Q3_K_M}, {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
                 {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},
                 {"f16", LLAMA_FTYPE_MOSTLY_F16}};
    int found = 0;
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); ++k) {
      if (strcmp(argv[4], kinds[k].name) == 0) {
        qp.ftype = kinds[k].ftype;
        found = 1;
      }
    }
    if (!found) {
      return die("quantize TYPE must be q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k_m, q4_k_m, "
                 "q5_k_m, q6_k or f16");
    }
    return llama_model_quantize(argv[2], argv[3], &qp) == 0 ? 0 : die("quantize failed");
  }
  const int vocab_only = strncmp(mode, "tokenize", 8) == 0;
  struct llama_model* model = load_model(argv[2], vocab_only);
  if (!model) return die("cannot load the model");
  const struct llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);

  if (strcmp(mode, "tokenize") == 0 && argc >= 4) {
    long len = 0;
    char* text = read_file(argv[3], &len);
    if (!text) return die("cannot read the text file");
    llama_token* ids = NULL;
    const int n = tokenize(vocab, text, len, &ids);
    for (int i = 0; i < n; ++i) printf("%d\n", ids[i]);
    return 0;
  }

  if (strcmp(mode, "tokenize-tests") == 0 && argc >= 4) {
    long len = 0;
    char* text = read_file(argv[3], &len);
    if (!text) return die("cannot read the test file");
    const char* sep = "\n__ggml_vocab_test__\n";
    const size_t sep_len = strlen(sep);
    char* at = text;
    while (at < text + len) {
      char* next = strstr(at, sep);
      const long n_bytes = next ? (long)(next - at) : (long)(text + len - at);
      llama_token* ids = NULL;
      const int n = tokenize_ex(vocab, at, n_bytes, &ids, 0);
      for (int i = 0; i < n; ++i) printf(" %d", ids[i]);
      printf("\n");
      free(ids);
      if (!next) break;
      at = next + sep_len;
    }
    return 0;
  }

  if (strcmp(mode, "greedy") == 0 && argc >= 4) {
    const int steps = atoi(argv[3]);
    struct llama_context* ctx =
        make_context(model, steps, 1, kv_type(argc >= 5 ? argv[4] : "f32"), 1);
    if (!ctx) return die("cannot create a context");
    llama_token tok = llama_vocab_bos(vocab);
    printf("%d\n", tok);
    for (int pos = 0; pos + 1 < steps; ++pos) {
      if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) return die("decode failed");
      tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
      printf("%d\n", tok);
      if (tok == llama_vocab_eos(vocab)) break;
    }
    return 0;
  }

  if (strcmp(mode, "nll") == 0 && argc >= 5) {
    long len = 0;
    char* text = read_file(argv[3], &len);
    if (!text) return die("cannot read the text file");
    llama_token* ids = NULL;
    int n = tokenize(vocab, text, len, &ids);
    const int want = atoi(argv[4]);
    if (n > want) n = want;
    struct llama_context* ctx = make_context(model, n, 1, kv_type(argc >= 6 ? argv[5] : "f32"), 1);
    if (!ctx) return die("cannot create a context");
    double total = 0;
    /* One token per decode call, like veloxquant eval's token-by-token run. */
    for (int i = 0; i + 1 < n; ++i) {
      if (llama_decode(ctx, llama_batch_get_one(&ids[i], 1)) != 0) return die("decode failed");
      const float* logits = llama_get_logits_ith(ctx, -1);
      double mx = logits[0];
      for (int v = 1; v < n_vocab; ++v) mx = logits[v] > mx ? logits[v] : mx;
      double sum = 0;
      for (int v = 0; v < n_vocab; ++v) sum += exp((double)logits[v] - mx);
      const double nll = -((double)logits[ids[i + 1]] - mx - log(sum));
      printf("%.9f\n", nll);
      total += nll;
    }
    printf("mean %.9f over %d predictions\n", total / (n - 1), n - 1);
    return 0;
  }

  if (strcmp(mode, "bench") == 0 && argc >= 7) {
    const int n_ctx = atoi(argv[3]), threads = atoi(argv[4]), n_steps = atoi(argv[6]);
    const int warmup = argc >= 8 ? atoi(argv[7]) : 2;
    if (n_ctx < 1 || threads < 1 || n_steps < 1 || warmup < 0)
      return die("bench: CTX, THREADS and N must be >= 1 and WARMUP >= 0");
    const enum ggml_type kv = kv_type(argv[5]);
    struct llama_context* ctx = make_context_fa(model, n_ctx + warmup + n_steps, threads, kv, 512,
                                                LLAMA_FLASH_ATTN_TYPE_AUTO);
    if (!ctx) return die("cannot create a context");
    /* Context: token ids cycling through the vocabulary (content does not change the cost). */
    llama_token* fill = malloc(sizeof(llama_token) * (size_t)n_ctx);
    for (int i = 0; i < n_ctx; ++i) fill[i] = (llama_token)(i % n_vocab);
    const double t_fill = seconds_now();
    for (int at = 0; at < n_ctx; at += 512) {
      const int len = n_ctx - at < 512 ? n_ctx - at : 512;
      if (llama_decode(ctx, llama_batch_get_one(fill + at, len)) != 0) return die("prefill failed");
    }
    const double fill_s = seconds_now() - t_fill;
    llama_token tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    double* step_s = malloc(sizeof(double) * (size_t)n_steps);
    double total = 0;
    for (int s = -warmup; s < n_steps; ++s) {
      const double t0 = seconds_now();
      if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) return die("decode failed");
      tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
      if (s >= 0) {
        step_s[s] = seconds_now() - t0;
        total += step_s[s];
      }
    }
    /* Median step (insertion sort: N is small). */
    for (int i = 1; i < n_steps; ++i) {
      const double x = step_s[i];
      int j = i - 1;
      for (; j >= 0 && step_s[j] > x; --j) step_s[j + 1] = step_s[j];
      step_s[j + 1] = x;
    }
    const double median =
        n_steps % 2 ? step_s[n_steps / 2] : 0.5 * (step_s[n_steps / 2 - 1] + step_s[n_steps / 2]);
    printf(
        "llama.cpp decode: ctx %d, threads %d, kv %s, flash_attn auto, %d warmup + %d steps: "
        "prefill %.3f s, median %.3f ms/token, mean %.3f ms/token\n",
        n_ctx, threads, argv[5], warmup, n_steps, fill_s, median * 1e3, total / n_steps * 1e3);
    free(step_s);
    free(fill);
    llama_free(ctx);
    return 0;
  }
  fprintf(stderr, "llamacpp_driver: unknown mode or missing arguments (see the source header)\n");
  return 2;
}
