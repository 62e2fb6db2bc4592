#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "engine/model/transformer.h"
#include "engine/model/weights_check.h"
#include "engine/run/generate.h"
#include "engine/run/qfilters_file.h"
#include "serve/footprint.h"
#include "veloxquant/builder.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::serve {

namespace {
using Clock = std::chrono::steady_clock;

ServeError bad_request(std::string msg, std::string param = "",
                       std::string type = "invalid_request_error") {
  return ServeError{400, std::move(type), std::move(msg), std::move(param), 0};
}
ServeError unavailable(std::string msg, int retry_after) {
  return ServeError{503, "server_error", std::move(msg), "", retry_after};
}

// Bytes at the end of `s` that begin an unfinished UTF-8 sequence (held back when streaming).
std::size_t incomplete_utf8_tail(const std::string& s) {
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    std::size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

// Number of code points (UTF-8 lead bytes and bytes that are not continuation bytes) in s.
std::int64_t code_points(std::string_view s) {
  std::int64_t n = 0;
  for (const char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}
}  // namespace

void adjust_logits(float* logits, const std::map<std::int32_t, std::int64_t>& counts,
                   float frequency, float presence,
                   const std::vector<std::pair<std::int32_t, float>>& bias) {
  if (frequency != 0.0f || presence != 0.0f) {
    for (const auto& [id, c] : counts) {
      if (c > 0) logits[id] -= static_cast<float>(c) * frequency + presence;
    }
  }
  for (const auto& [id, b] : bias) logits[id] += b;
}

namespace {
// Log probabilities at one step under the softmax of `logits` (double precision): the chosen
// token's is filled in later (entry.logprob = logits[chosen] - log_z).
struct StepLogprobs {
  double log_z = 0;
  std::vector<std::pair<std::int32_t, float>> top;  // (id, logprob), descending
};
StepLogprobs step_logprobs(const float* logits, std::int64_t vocab, int k,
                           std::vector<std::int32_t>& ids) {
  StepLogprobs out;
  double mx = logits[0];
  for (std::int64_t i = 1; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (std::int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  out.log_z = mx + std::log(sum);
  if (k > 0) {
    ids.resize(static_cast<std::size_t>(vocab));
    for (std::int64_t i = 0; i < vocab; ++i)
      ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    const std::size_t kk = std::min<std::size_t>(static_cast<std::size_t>(k), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(kk), ids.end(),
                      [&](std::int32_t a, std::int32_t b) {
                        return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
                      });
    for (std::size_t i = 0; i < kk; ++i)
      out.top.emplace_back(ids[i], static_cast<float>(logits[ids[i]] - out.log_z));
  }
  return out;
}
}  // namespace

// ---- Job ----------------------------------------------------------------------------------

Job::Snapshot Job::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(m_);
  cv_.wait_for(lock, timeout, [&] { return news_ || done_; });
  Snapshot s;
  s.text.swap(pending_);
  s.logprobs.swap(pending_logprobs_);
  news_ = false;
  s.admitted = admitted_;
  s.done = done_;
  s.finish_reason = finish_reason_;
  s.error = error_;
  s.prompt_tokens = prompt_tokens_;
  s.cached_tokens = cached_tokens_;
  s.completion_tokens = completion_tokens_;
  s.session = session_;
  s.kv_resident = kv_resident_;
  s.kv_full = kv_full_;
  s.kv_payload = kv_payload_;
  s.kv_reserved = kv_reserved_;
  return s;
}

void Job::notify() {
  cv_.notify_all();
  if (wake_) wake_->notify();
}

void Job::push(const std::string& text, std::vector<TokenLogprob> logprobs) {
  if (text.empty() && logprobs.empty()) return;
  {
    std::lock_guard lock(m_);
    pending_ += text;
    for (auto& e : logprobs) pending_logprobs_.push_back(std::move(e));
    news_ = true;
  }
  notify();
}

void Job::finish(const std::string& reason) {
  {
    std::lock_guard lock(m_);
    admitted_ = true;
    done_ = true;
    finish_reason_ = reason;
  }
  notify();
}

void Job::fail(ServeError e) {
  {
    std::lock_guard lock(m_);
    admitted_ = true;
    done_ = true;
    error_ = std::move(e);
  }
  notify();
}

void Job::set_admitted() {
  {
    std::lock_guard lock(m_);
    admitted_ = true;
    news_ = true;
  }
  notify();
}

// ---- Sessions and active requests ---------------------------------------------------------

struct Scheduler::Session {
  std::string id;
  CacheConfig method;
  std::string spec;
  ModelCache cache;
  bool chat = true;
  std::vector<Message> history;    // the conversation so far; its last, the reply generated
  std::vector<std::int32_t> tail;  // sampled, not yet fed: run before the next turn's tokens
  bool ended_with_eot = false;     // the reply ended with the template's end-of-turn token
  std::int64_t reserved = 0;
  std::int64_t resident = 0, full = 0;
  bool busy = false;
  Clock::time_point last_used = Clock::now();
  std::int64_t payload = 0;  // K/V payload (CacheStats::kept_bytes), part of resident
  bool persisted = false;    // its last turn was queued for --session-dir
};

struct Scheduler::Active {
  std::shared_ptr<Job> job;
  Session* s = nullptr;
  std::vector<std::int32_t> feed;  // tokens to run before sampling
  std::size_t fed = 0;
  std::optional<engine::Sampler> sampler;
  std::int32_t prev = -1, last = -1;  // the token before `last`; `last`: next to run (decode)
  std::int64_t generated = 0;
  std::string text;         // the reply so far
  std::size_t emitted = 0;  // bytes of `text` given to the job
  std::size_t max_stop = 0;
  std::int64_t chars = 0;                       // code points in `text`
  std::map<std::int32_t, std::int64_t> counts;  // generated tokens (penalties)
  std::vector<TokenLogprob> logprobs;           // one per generated token (when asked)
  std::size_t lp_emitted = 0;                   // entries given to the job
};

// ---- Scheduler ----------------------------------------------------------------------------

Scheduler::Scheduler(const engine::Model& model, const engine::Tokenizer& tokenizer,
                     const ChatTemplate& chat, SchedulerOptions options)
    : model_(&model),
      tok_(&tokenizer),
      chat_(&chat),
      o_(std::move(options)),
      stop_token_(model.config().format == "llama2c" ? 1 : model.config().eos_id),
      forward_(model, std::clamp<std::int64_t>(o_.max_context, 1, model.config().seq_len),
               std::clamp<std::int64_t>(o_.max_context, 1, model.config().seq_len),
               std::max({std::int64_t{1}, o_.step_tokens,
                         std::clamp<std::int64_t>(o_.max_context, 1, model.config().seq_len)})),
      repeat_(engine::repeat_prompt(tokenizer)) {
  const auto& c = model.config();
  auto bad = [](const std::string& m) { throw Error(ErrorCode::kInvalidArgument, m); };
  if (o_.max_context < 2 || o_.max_context > c.seq_len)
    bad("--max-context must be in [2, " + std::to_string(c.seq_len) +
        "] (the model's context), got " + std::to_string(o_.max_context));
  if (o_.chunk < 1 || o_.chunk > o_.step_tokens || o_.chunk > o_.max_context)
    bad("--prefill-chunk must be in [1, min(--step-tokens, --max-context)], got " +
        std::to_string(o_.chunk));
  if (o_.kv_memory < 1) bad("--kv-memory must be positive");
  if (o_.max_sessions < 1) bad("--max-sessions must be >= 1");
  if (o_.max_queue < 0) bad("--max-queue must be >= 0");
  if (o_.max_method_specs < 1)
    bad("--max-method-specs must be >= 1, got " + std::to_string(o_.max_method_specs));
  if (o_.client_methods < 1 || o_.client_methods > o_.max_method_specs) {
    bad("--client-methods must be in [1, --max-method-specs " +
        std::to_string(o_.max_method_specs) + "], got " + std::to_string(o_.client_methods));
  }
  // The startup specs: the default method, then each allowed one (measured here, pinned).
  std::vector<CacheConfig> startup{o_.default_method};
  for (const auto& m : o_.methods_allowed) startup.push_back(m);
  for (std::size_t i = 0; i < startup.size(); ++i) {
    const std::string spec = startup[i].spec(true);
    if (footprints_.count(spec) != 0) continue;
    if (static_cast<std::int64_t>(footprints_.size()) >= o_.max_method_specs) {
      bad("--methods-allowed names more distinct specs (with --method's) than --max-method-specs " +
          std::to_string(o_.max_method_specs) + " allows: '" + startup[i].spec() +
          "' is one too many");
    }
    std::int64_t bytes = 0;
    if (i == 0) {
      bytes = measure(startup[i]);  // the server reports --method against --kv-memory itself
    } else {
      try {
        bytes = measure(startup[i]);
      } catch (const Error& e) {
        bad("--methods-allowed: spec '" + startup[i].spec() + "' cannot be measured: " + e.what());
      }
      if (bytes > o_.kv_memory) {
        bad("--methods-allowed: a session of spec '" + startup[i].spec() + "' may hold " +
            std::to_string(bytes) + " bytes or more (--max-context " +
            std::to_string(o_.max_context) + "), more than --kv-memory " +
            std::to_string(o_.kv_memory) + " allows");
      }
    }
    auto e = std::make_shared<Measured>();
    e->spec = spec;
    e->method = startup[i];
    e->bytes = bytes;
    e->ready = e->pinned = true;
    fp_lru_.push_back(spec);
    e->lru = std::prev(fp_lru_.end());
    footprints_[spec] = std::move(e);
    ++fp_measurements_;
  }
  counters_.kv_memory = o_.kv_memory;
  if (!o_.session_dir.empty()) {
    store_ = std::make_unique<SessionStore>(o_.session_dir, o_.session_dir_bytes,
                                            model_identity(model, tokenizer),
                                            engine::to_string(chat.kind()));
  }
  fp_thread_ = std::thread([this] { measure_loop(); });
  thread_ = std::thread([this] { loop(); });
  if (store_) restore_thread_ = std::thread([this] { restore_loop(); });
}

std::int64_t Scheduler::measure(const CacheConfig& method) const {
  return session_footprint(method, engine::model_shape(model_->config()), o_.max_context,
                           o_.chunk, o_.kv_memory);
}

// The measuring thread: one new spec at a time, fp_m_ released while it measures.
void Scheduler::measure_loop() {
  std::unique_lock lock(fp_m_);
  for (;;) {
    fp_work_cv_.wait(lock, [&] { return fp_stop_ || !fp_work_.empty(); });
    if (fp_stop_) break;
    const std::shared_ptr<Measured> e = fp_work_.front();
    fp_work_.pop_front();
    lock.unlock();
    std::int64_t bytes = 0;
    std::string error;
    try {
      bytes = measure(e->method);
    } catch (const std::exception& x) {
      error = x.what();
      if (error.empty()) error = "the footprint of method '" + e->method.spec() + "' failed";
    }
    lock.lock();
    ++fp_measurements_;
    if (error.empty()) {
      e->bytes = bytes;
      e->ready = true;
    } else {
      e->error = std::move(error);
      const auto it = footprints_.find(e->spec);
      if (it != footprints_.end() && it->second == e) {
        fp_lru_.erase(e->lru);
        footprints_.erase(it);
      }
    }
    fp_done_cv_.notify_all();
  }
  // Stopping: whoever still waits is told.
  for (auto& e : fp_work_) e->error = "the server is shutting down";
  fp_work_.clear();
  fp_done_cv_.notify_all();
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(fp_m_);
    fp_stop_ = true;
  }
  fp_work_cv_.notify_all();
  if (fp_thread_.joinable()) fp_thread_.join();
  {
    std::lock_guard lock(m_);
    stopping_ = true;
  }
  cv_.notify_all();
  restore_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (restore_thread_.joinable()) restore_thread_.join();
  for (auto& w : restore_work_) w.job->fail(unavailable("the server is shutting down", 1));
  for (auto& w : restore_done_) w.job->fail(unavailable("the server is shutting down", 1));
  for (auto& a : active_) a->job->fail(unavailable("the server is shutting down", 1));
  for (auto& j : queue_) j->fail(unavailable("the server is shutting down", 1));
}

std::int64_t Scheduler::footprint(const CacheConfig& method, const std::string& client,
                                  const std::atomic<bool>* cancelled) {
  const std::string spec = method.spec(true);
  std::unique_lock lock(fp_m_);
  std::shared_ptr<Measured> e;
  if (const auto it = footprints_.find(spec); it != footprints_.end()) {
    e = it->second;
    fp_lru_.splice(fp_lru_.begin(), fp_lru_, e->lru);
  } else {
    if (!o_.methods_allowed.empty()) {
      std::string list;
      for (const auto& [s, m] : footprints_) {  // in spec order: the same text every time
        if (m->pinned) list += (list.empty() ? "" : "; ") + m->method.spec();
      }
      throw bad_request("method '" + method.spec() +
                            "' is not served here: expected --method or one of "
                            "--methods-allowed (" + list + ")",
                        "veloxquant.method", "invalid_request_error");
    }
    if (fp_stop_) throw unavailable("the server is shutting down", 1);
    auto full = [&](const std::string& what) {
      return ServeError{429, "rate_limit_exceeded", what, "veloxquant.method", 1,
                        "method_specs_full"};
    };
    // Drops the least recently used measured entry that `pick` accepts (never a pinned one,
    // nor one being measured: its waiters hold it).
    auto drop_lru = [&](auto pick) {
      for (auto l = fp_lru_.end(); l != fp_lru_.begin();) {
        --l;
        const auto f = footprints_.find(*l);
        const Measured& m = *f->second;
        if (m.pinned || !m.ready || !pick(m)) continue;
        footprints_.erase(f);
        fp_lru_.erase(l);
        return true;
      }
      return false;
    };
    if (!client.empty()) {
      auto own = [&](const Measured& m) { return m.client == client; };
      std::int64_t n_own = 0;
      for (const auto& [s, m] : footprints_) n_own += !m->pinned && own(*m) ? 1 : 0;
      while (n_own >= o_.client_methods && drop_lru(own)) --n_own;
      if (n_own >= o_.client_methods) {
        throw full("method '" + method.spec() + "': this client's " + std::to_string(n_own) +
                   " method specs (--client-methods " + std::to_string(o_.client_methods) +
                   ") are all still being measured; retry when one is done");
      }
    }
    const auto any = [](const Measured&) { return true; };
    while (static_cast<std::int64_t>(footprints_.size()) >= o_.max_method_specs && drop_lru(any)) {
    }
    if (static_cast<std::int64_t>(footprints_.size()) >= o_.max_method_specs) {
      throw full("method '" + method.spec() + "': the server already knows --max-method-specs " +
                 std::to_string(o_.max_method_specs) +
                 " method specs, none of which can be dropped now (startup specs or still being "
                 "measured); retry later or name a known spec");
    }
    e = std::make_shared<Measured>();
    e->spec = spec;
    e->method = method;
    e->client = client;
    fp_lru_.push_front(spec);
    e->lru = fp_lru_.begin();
    footprints_[spec] = e;
    fp_work_.push_back(e);
    fp_work_cv_.notify_one();
  }
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(0.0, o_.queue_timeout_s)));
  while (!e->ready && e->error.empty()) {
    if (cancelled != nullptr && cancelled->load()) {
      throw unavailable("the request was cancelled while method '" + method.spec() +
                            "' was being measured",
                        1);
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      throw unavailable("the footprint of method '" + method.spec() +
                            "' is still being measured after --queue-timeout; retry shortly",
                        1);
    }
    fp_done_cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(100)));
  }
  if (!e->error.empty()) throw bad_request(e->error, "veloxquant.method");
  return e->bytes;
}

std::size_t Scheduler::cached_methods(const std::string& client) {
  std::lock_guard lock(fp_m_);
  if (client.empty()) return footprints_.size();
  std::size_t n = 0;
  for (const auto& [s, m] : footprints_) n += m->client == client ? 1 : 0;
  return n;
}

void Scheduler::submit(const std::shared_ptr<Job>& job) {
  const std::int64_t need = footprint(job->req.method, job->req.client, &job->cancelled_);
  job->need_ = need;  // admission uses this (the cache may drop the spec meanwhile)
  if (need > o_.kv_memory) {
    throw bad_request("a session of method '" + job->req.method.spec() + "' may hold " +
                          std::to_string(need) + " bytes or more of K/V cache (--max-context " +
                          std::to_string(o_.max_context) + "), more than --kv-memory " +
                          std::to_string(o_.kv_memory) + " allows",
                      "veloxquant.method");
  }
  {
    std::lock_guard lock(m_);
    if (draining_ || stopping_) {
      ++counters_.requests_rejected;
      throw unavailable("the server is shutting down", 1);
    }
    // Requests whose clients left do not hold places: they leave the queue now, not at the
    // next step (which may be a long prefill away).
    drop_cancelled_queued_locked();
    if (static_cast<std::int64_t>(queue_.size()) >= o_.max_queue) {
      ++counters_.requests_rejected;
      throw unavailable("too many requests are waiting for K/V memory (queue of " +
                            std::to_string(o_.max_queue) + " full); retry later",
                        1);
    }
    queue_.push_back(job);
  }
  cv_.notify_all();
}

void Scheduler::drop_cancelled_queued_locked() {
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->cancelled()) {
      ++counters_.requests_cancelled;
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::drop_session_locked(Session* s) {
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->get() == s) {
      reserved_ -= s->reserved;
      sessions_.erase(it);
      return;
    }
  }
}

bool Scheduler::reuse_session_locked(const GenRequest& r, const std::string& spec, Active& a) {
  for (auto& sp : sessions_) {
    Session& s = *sp;
    if (s.busy || !s.chat || s.spec != spec || s.history.size() >= r.messages.size()) continue;
    if (!std::equal(s.history.begin(), s.history.end(), r.messages.begin())) continue;
    std::vector<std::int32_t> feed = continuation(s, r);
    if (s.cache.layer(0).tokens_seen() + static_cast<std::int64_t>(feed.size()) + 1 >
        o_.max_context) {
      return false;  // the conversation no longer fits: a new session says so
    }
    a.s = &s;
    a.feed = std::move(feed);
    ++counters_.sessions_reused;
    return true;
  }
  return false;
}

std::vector<std::int32_t> Scheduler::continuation(const Session& s, const GenRequest& r) const {
  std::vector<std::int32_t> feed = s.tail;
  std::vector<engine::ChatSpan> spans = {
      {s.ended_with_eot ? chat_->close_after_end() : chat_->close_without_end(), false}};
  for (auto& span : chat_->render_spans(r.messages, s.history.size()))
    spans.push_back(std::move(span));
  const auto ids = chat_->tokenize(spans, false);
  feed.insert(feed.end(), ids.begin(), ids.end());
  return feed;
}

void Scheduler::restore_loop() {
  std::unique_lock lock(m_);
  for (;;) {
    restore_cv_.wait(lock, [&] { return stopping_ || !restore_work_.empty(); });
    if (stopping_) return;
    Restoring w = std::move(restore_work_.front());
    restore_work_.pop_front();
    lock.unlock();
    // The session is busy and in no step: only this thread touches its cache now.
    const GenRequest& r = w.job->req;
    for (const auto& [path, k] : w.job->restore_from_) {
      if (w.job->cancelled()) break;
      const std::vector<Message> prefix(r.messages.begin(),
                                        r.messages.begin() + static_cast<std::ptrdiff_t>(k));
      try {
        std::optional<SessionRecord> rec = store_->read(path, w.s->spec, prefix);
        if (!rec) continue;
        w.s->cache.load_state(rec->state.data(), rec->state.size());
        if (w.s->cache.layer(0).tokens_seen() != rec->tokens_seen) {
          const std::int64_t held = w.s->cache.layer(0).tokens_seen();
          w.s->cache = session_cache(w.s->method);
          throw Error(ErrorCode::kFileError,
                      "session file '" + path + "': the header says " +
                          std::to_string(rec->tokens_seen) + " positions, the cache holds " +
                          std::to_string(held),
                      path);
        }
        rec->state.clear();
        rec->state.shrink_to_fit();
        w.meta = std::move(*rec);
        w.ok = true;
        break;
      } catch (const Error& e) {
        ++w.errors;
        std::fprintf(stderr, "serve: cannot restore session: %s (file removed)\n", e.what());
        std::error_code ec;
        std::filesystem::remove(path, ec);
      }
    }
    lock.lock();
    restore_done_.push_back(std::move(w));
    cv_.notify_all();  // the scheduler thread starts it
  }
}

void Scheduler::finish_restore_locked(Restoring& w) {
  --restoring_;
  counters_.session_restore_errors += w.errors;
  Session* s = w.s;
  const GenRequest& r = w.job->req;
  if (w.job->cancelled()) {
    ++counters_.requests_cancelled;
    w.job->fail(unavailable("the client disconnected", 0));
    drop_session_locked(s);
    return;
  }
  if (draining_ || stopping_) {
    w.job->fail(unavailable("the server is shutting down", 1));
    drop_session_locked(s);
    return;
  }
  auto a = std::make_unique<Active>();
  a->job = w.job;
  a->s = s;
  std::int64_t cached = 0;
  try {
    if (w.ok) {
      s->history = std::move(w.meta.history);
      s->tail = std::move(w.meta.tail);
      s->ended_with_eot = w.meta.ended_with_eot;
      s->persisted = true;
      std::vector<std::int32_t> feed = continuation(*s, r);
      if (w.meta.tokens_seen + static_cast<std::int64_t>(feed.size()) + 1 <= o_.max_context) {
        ++counters_.sessions_restored;
        // A reply in the request after the restored turn: the client changed it (or the turn
        // after it was never saved), so the session resumes from the turn before.
        for (std::size_t k = s->history.size(); k < r.messages.size(); ++k) {
          if (r.messages[k].role == "assistant") {
            ++counters_.snapshot_hits;
            break;
          }
        }
        a->feed = std::move(feed);
        cached = w.meta.tokens_seen;
      } else {
        w.ok = false;  // the conversation no longer fits: a new session says so
      }
    }
    if (!w.ok) {
      // No file could be used: the session starts from the whole conversation, on a fresh
      // cache (its memory is reserved already).
      s->cache = session_cache(s->method);
      s->history.clear();
      s->tail.clear();
      s->ended_with_eot = false;
      s->persisted = false;
      a->feed = prompt_tokens(r);
    }
  } catch (const ServeError& e) {
    w.job->fail(e);
    drop_session_locked(s);
    return;
  } catch (const Error& e) {
    w.job->fail(bad_request(e.what()));
    drop_session_locked(s);
    return;
  }
  start_locked(std::move(a), cached);
}

std::vector<std::int32_t> Scheduler::prompt_tokens(const GenRequest& r) const {
  std::vector<std::int32_t> feed;
  if (r.chat) {
    feed = chat_->tokenize(chat_->render_spans(r.messages, 0), true);
  } else {
    feed = tok_->encode(r.prompt, true);
  }
  if (feed.empty()) {
    if (model_->config().bos_id < 0)
      throw bad_request("the prompt is empty and the model has no BOS token", "prompt");
    feed.push_back(model_->config().bos_id);
  }
  if (static_cast<std::int64_t>(feed.size()) + 1 > o_.max_context) {
    throw ServeError{400, "invalid_request_error",
                     "the prompt has " + std::to_string(feed.size()) +
                         " tokens; with one to generate that passes --max-context " +
                         std::to_string(o_.max_context),
                     r.chat ? "messages" : "prompt", 0};
  }
  return feed;
}

bool Scheduler::make_room_locked(std::int64_t need) {
  auto fits = [&] {
    return reserved_ + need <= o_.kv_memory &&
           static_cast<std::int64_t>(sessions_.size()) < o_.max_sessions;
  };
  if (fits()) return true;
  // Would dropping every idle session make room? Then drop them LRU-first until it fits.
  std::int64_t idle_bytes = 0, idle_n = 0;
  for (auto& s : sessions_) {
    if (!s->busy) {
      idle_bytes += s->reserved;
      ++idle_n;
    }
  }
  if (reserved_ - idle_bytes + need > o_.kv_memory ||
      static_cast<std::int64_t>(sessions_.size()) - idle_n >= o_.max_sessions)
    return false;
  while (!fits()) {
    auto it = sessions_.end();
    do {
      --it;
    } while ((*it)->busy);
    reserved_ -= (*it)->reserved;
    if ((*it)->persisted) ++counters_.sessions_spilled;
    sessions_.erase(it);
    ++counters_.sessions_evicted;
  }
  return true;
}

ModelCache Scheduler::session_cache(const CacheConfig& method) const {
  ModelCache cache = engine::make_model_cache(method, *model_);
  if (!o_.head_pattern.empty() && method.info().head_types) cache.set_head_pattern(o_.head_pattern);
  // kvzip: the session's prompts wait for the reconstruction pass step() runs after them.
  if (cache.reads_reconstruction()) cache.set_reconstruction(true);
  // Memory only: a session holds at most --max-context positions, so its stores grow no
  // further (the footprint is measured with the same hint).
  cache.expect_positions(o_.max_context);
  return cache;
}

Scheduler::Session* Scheduler::new_session_locked(const GenRequest& r, const std::string& spec,
                                                  std::int64_t need) {
  auto s = std::make_unique<Session>(Session{std::to_string(next_session_++), r.method, spec,
                                             session_cache(r.method), r.chat, {}, {}, false, need,
                                             0, 0, false, Clock::now()});
  s->id = "s" + s->id;
  reserved_ += need;
  sessions_.push_front(std::move(s));
  return sessions_.front().get();
}

void Scheduler::start_locked(std::unique_ptr<Active> a, std::int64_t cached) {
  const GenRequest& r = a->job->req;
  Session& s = *a->s;
  s.busy = true;
  s.tail.clear();
  s.last_used = Clock::now();
  // top_p 0 keeps only the most probable token: greedy, as temperature 0 (the sampler itself
  // treats top_p 0 as "no nucleus", run.c's rule).
  a->sampler.emplace(model_->config().vocab_size, r.top_p == 0.0f ? 0.0f : r.temperature, r.top_p,
                     r.seed);
  for (const auto& st : r.stop) a->max_stop = std::max(a->max_stop, st.size());
  a->prev = a->feed.back();
  Job& job = *a->job;
  {
    std::lock_guard lock(job.m_);
    job.prompt_tokens_ = cached + static_cast<std::int64_t>(a->feed.size());
    job.cached_tokens_ = cached;
    job.session_ = s.id;
    job.kv_reserved_ = s.reserved;
  }
  job.set_admitted();
  active_.push_back(std::move(a));
}

bool Scheduler::admit_locked(const std::shared_ptr<Job>& job) {
  const GenRequest& r = job->req;
  const std::string spec = r.method.spec(true);
  auto a = std::make_unique<Active>();
  a->job = job;
  std::int64_t cached = 0;  // positions of a reused session's cache
  try {
    if (r.chat && reuse_session_locked(r, spec, *a)) cached = a->s->cache.layer(0).tokens_seen();
    if (a->s == nullptr && r.chat && store_ && !job->looked_up_) {
      job->looked_up_ = true;
      job->restore_from_ = store_->candidates(spec, r.messages);
    }
    if (a->s == nullptr && !job->restore_from_.empty()) {
      // A saved turn to continue: the memory is reserved now, the file read on the restore
      // thread (the job leaves the queue; it starts when the restore is done).
      if (!make_room_locked(job->need_)) return false;
      Session* s = new_session_locked(r, spec, job->need_);
      s->busy = true;
      restore_work_.push_back(Restoring{job, s, false, 0, {}});
      ++restoring_;
      restore_cv_.notify_one();
      return true;
    }
    if (a->s == nullptr) {
      std::vector<std::int32_t> feed = prompt_tokens(r);
      const std::int64_t need = job->need_;  // measured at submit, never on this thread
      if (!make_room_locked(need)) return false;  // wait in the queue
      a->s = new_session_locked(r, spec, need);
      a->feed = std::move(feed);
    }
  } catch (const ServeError& e) {
    job->fail(e);
    return true;
  } catch (const Error& e) {
    job->fail(bad_request(e.what()));
    return true;
  }
  start_locked(std::move(a), cached);
  return true;
}

void Scheduler::end_active(Active& a, const std::string& reason, std::optional<ServeError> err) {
  Session* s = a.s;
  if (err) {
    a.job->fail(*err);
    drop_session_locked(s);
  } else {
    std::vector<TokenLogprob> rest(
        std::make_move_iterator(a.logprobs.begin() + static_cast<std::ptrdiff_t>(a.lp_emitted)),
        std::make_move_iterator(a.logprobs.end()));
    a.lp_emitted = a.logprobs.size();
    a.job->push(a.emitted < a.text.size() ? a.text.substr(a.emitted) : std::string(),
                std::move(rest));
    a.emitted = a.text.size();
    {
      std::lock_guard lock(a.job->m_);
      a.job->completion_tokens_ = a.generated;
      a.job->kv_resident_ = s->resident;
      a.job->kv_full_ = s->full;
      a.job->kv_payload_ = s->payload;
    }
    bool deferred = false;  // the job finishes when its session file is written
    if (s->chat) {
      s->history = a.job->req.messages;
      // The reply as the client received it: JSON carries invalid UTF-8 (a byte token cut from
      // its sequence) as U+FFFD, so the next turn's copy of it matches this one.
      const std::string sent =
          nlohmann::json(a.text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      s->history.push_back(Message{"assistant", nlohmann::json::parse(sent).get<std::string>()});
      s->busy = false;
      s->last_used = Clock::now();
      if (store_) {
        // The turn's state, copied now (the next turn changes the cache) and written by the
        // store's thread; the reply ends (the job finishes) once its file is durable, so a
        // client that has its reply can continue the conversation on any server sharing the
        // directory, even if this one dies right after.
        try {
          SessionRecord rec{s->spec, s->history, s->tail, s->ended_with_eot,
                            s->cache.layer(0).tokens_seen(), s->cache.save_state()};
          std::shared_ptr<Job> job = a.job;
          s->persisted = store_->put(std::move(rec), [job, reason] { job->finish(reason); });
          deferred = s->persisted;
        } catch (const std::exception& e) {
          s->persisted = false;
          std::fprintf(stderr, "serve: session %s not saved: %s\n", s->id.c_str(), e.what());
        }
      }
      for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
        if (it->get() == s) {
          sessions_.splice(sessions_.begin(), sessions_, it);
          break;
        }
      }
    } else {
      drop_session_locked(s);
    }
    if (!deferred) a.job->finish(reason);
  }
  for (auto it = active_.begin(); it != active_.end(); ++it) {
    if (it->get() == &a) {
      active_.erase(it);
      break;
    }
  }
}

void Scheduler::loop() {
  std::vector<Active*> run;
  for (;;) {
    {
      std::unique_lock lock(m_);
      if (stopping_) return;
      // The queue: drop cancelled jobs, time out old ones, admit in order while they fit.
      const auto now = Clock::now();
      for (auto it = queue_.begin(); it != queue_.end();) {
        const double waited = std::chrono::duration<double>(now - (*it)->queued_at_).count();
        if ((*it)->cancelled()) {
          ++counters_.requests_cancelled;
          it = queue_.erase(it);
        } else if (draining_ || waited > o_.queue_timeout_s) {
          (*it)->fail(unavailable(draining_ ? "the server is shutting down"
                                            : "no K/V memory came free within the queue timeout (" +
                                                  std::to_string(o_.queue_timeout_s) + " s)",
                                  1));
          ++counters_.requests_rejected;
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      while (!restore_done_.empty()) {
        Restoring w = std::move(restore_done_.front());
        restore_done_.pop_front();
        finish_restore_locked(w);
      }
      while (!queue_.empty() && admit_locked(queue_.front())) queue_.pop_front();
      // Cancelled (client gone) and aborted (shutdown past its grace) requests end here.
      for (auto it = active_.begin(); it != active_.end();) {
        Active& a = **it;
        ++it;
        if (a.job->cancelled()) {
          ++counters_.requests_cancelled;
          end_active(a, "", unavailable("the client disconnected", 0));
        } else if (abort_active_) {
          // OpenAI has no finish reason for a reply cut short by the server: the request fails
          // (a stream gets an error event, then [DONE]) and may be retried elsewhere.
          end_active(a, "", unavailable("the server shut down before the reply was finished", 1));
        }
      }
      if (active_.empty()) {
        cv_.notify_all();  // drain() waits for this
        cv_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      // This step's sessions: in admission order from a rotating start, while the step's token
      // budget lasts (each takes its own fixed-size chunk, so its tokens do not depend on who
      // else runs).
      run.clear();
      std::vector<Active*> all;
      for (auto& a : active_) all.push_back(a.get());
      std::int64_t tokens = 0;
      const std::size_t n = all.size();
      for (std::size_t k = 0; k < n; ++k) {
        Active* a = all[(rr_ + k) % n];
        const std::int64_t want = a->fed < a->feed.size() ? prefill_take(*a) : 1;
        if (tokens + want > o_.step_tokens) continue;
        tokens += want;
        run.push_back(a);
      }
      rr_ = (rr_ + 1) % std::max<std::size_t>(1, n);
    }
    step(run);
  }
}

std::int64_t Scheduler::prefill_take(const Active& a) const {
  const auto left = static_cast<std::int64_t>(a.feed.size() - a.fed);
  std::int64_t take = std::min<std::int64_t>(o_.chunk, left);
  if (left - take == 1 && take > 1 && a.s->cache.reads_reconstruction()) --take;
  return take;
}

void Scheduler::step(std::vector<Active*>& run) {
  const auto& c = model_->config();
  std::vector<engine::BatchItem> items;
  items.reserve(run.size());
  for (Active* a : run) {
    engine::BatchItem it;
    it.cache = &a->s->cache;
    if (a->fed < a->feed.size()) {
      it.n = prefill_take(*a);
      it.tokens = a->feed.data() + a->fed;
      it.logits = a->fed + static_cast<std::size_t>(it.n) == a->feed.size() ? engine::Logits::kLast
                                                                            : engine::Logits::kNone;
    } else {
      it.n = 1;
      it.tokens = &a->last;
      it.logits = engine::Logits::kLast;
    }
    items.push_back(it);
  }
  std::optional<std::string> failure;
  // kvzip: a session whose prompt ends in this step runs its reconstruction pass now (outside
  // the lock, as the step), after the step's logits were copied aside (the pass's own steps
  // replace them).
  std::vector<std::vector<float>> step_logits;
  double reconstruction_seconds = 0;
  std::int64_t reconstructions = 0;
  try {
    forward_.forward(items);
    std::vector<std::size_t> ends;
    for (std::size_t i = 0; i < run.size(); ++i) {
      const Active& a = *run[i];
      if (a.fed < a.feed.size() && a.fed + static_cast<std::size_t>(items[i].n) == a.feed.size() &&
          items[i].n > 1 && a.s->cache.reads_reconstruction()) {
        ends.push_back(i);
      }
    }
    if (!ends.empty()) {
      step_logits.resize(items.size());
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (items[i].logits == engine::Logits::kNone) continue;
        const float* l = forward_.logits(i);
        step_logits[i].assign(l, l + c.vocab_size);
      }
      for (const std::size_t i : ends) {
        Active& a = *run[i];
        reconstruction_seconds +=
            forward_.reconstruct(a.feed.data(), static_cast<std::int64_t>(a.feed.size()),
                                 a.s->cache, repeat_);
        ++reconstructions;
      }
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  std::lock_guard lock(m_);
  if (failure) {
    for (Active* a : run)
      end_active(*a, "", ServeError{500, "server_error", "the forward step failed: " + *failure, "", 0});
    return;
  }
  ++counters_.steps;
  counters_.reconstructions += reconstructions;
  counters_.reconstruction_seconds += reconstruction_seconds;
  std::int64_t generated = 0;
  std::vector<float> work(static_cast<std::size_t>(c.vocab_size));
  std::vector<std::int32_t> ids;  // top_logprobs' sort
  for (std::size_t i = 0; i < run.size(); ++i) {
    Active& a = *run[i];
    Session& s = *a.s;
    if (a.fed < a.feed.size()) {
      a.fed += static_cast<std::size_t>(items[i].n);
      counters_.tokens_prefilled += items[i].n;
    }
    const CacheStats st = s.cache.stats();
    s.resident = st.resident_bytes;
    s.full = st.full_bytes;
    s.payload = st.kept_bytes;
    if (s.resident > s.reserved) {
      ++counters_.footprint_exceeded;
      std::fprintf(stderr, "serve: session %s (%s) holds %lld resident bytes, above its %lld\n",
                   s.id.c_str(), s.spec.c_str(), static_cast<long long>(s.resident),
                   static_cast<long long>(s.reserved));
    }
    {
      std::lock_guard jl(a.job->m_);
      a.job->kv_resident_ = s.resident;
      a.job->kv_full_ = s.full;
      a.job->kv_payload_ = s.payload;
    }
    if (items[i].logits == engine::Logits::kNone) continue;
    const float* logits = step_logits.empty() ? forward_.logits(i) : step_logits[i].data();
    if (!engine::all_finite(logits, c.vocab_size)) {
      // generate's and eval's check: a NaN or an infinity is never sampled into text (greedy
      // would return an empty reply, sampling one token repeated). The request fails with 500
      // and its session is dropped.
      std::string why;
      try {
        engine::check_finite(logits, c.vocab_size,
                             "[serve] logits after position " + std::to_string(s.cache.layer(0).tokens_seen() - 1));
      } catch (const Error& e) {
        why = e.what();
      }
      end_active(a, "", ServeError{500, "server_error",
                                   "the model's output is not finite: " + why +
                                       "; the checkpoint's weights or settings (e.g. RoPE "
                                       "scaling) overflow on this input",
                                   "", 0});
      continue;
    }
    const GenRequest& req = a.job->req;
    StepLogprobs lp;
    if (req.logprobs) lp = step_logprobs(logits, c.vocab_size, req.top_logprobs, ids);
    std::copy(logits, logits + c.vocab_size, work.begin());
    adjust_logits(work.data(), a.counts, req.frequency_penalty, req.presence_penalty,
                  req.logit_bias);
    const std::int32_t next = a.sampler->sample(work.data());
    const std::int64_t seen = s.cache.layer(0).tokens_seen();
    if (next == stop_token_ || next == chat_->end_of_turn()) {
      s.ended_with_eot = s.chat && next == chat_->end_of_turn();
      if (s.ended_with_eot) s.tail = {next};
      end_active(a, "stop", std::nullopt);
      continue;
    }
    ++a.generated;
    ++generated;
    ++a.counts[next];
    const std::string piece = tok_->piece(a.prev, next);
    if (req.logprobs) {
      TokenLogprob e;
      e.token = piece;
      e.logprob = static_cast<float>(static_cast<double>(logits[next]) - lp.log_z);
      e.offset = static_cast<std::int64_t>(a.text.size());
      e.text_offset = a.chars;
      for (const auto& [id, l] : lp.top) e.top.emplace_back(tok_->piece(a.prev, id), l);
      a.logprobs.push_back(std::move(e));
    }
    a.text += piece;
    a.chars += code_points(piece);
    a.prev = next;
    a.last = next;
    s.ended_with_eot = false;
    // Stop strings: the reply ends before the first one; text that could begin one is held.
    std::size_t cut = std::string::npos;
    for (const std::string& sw : a.job->req.stop) {
      const std::size_t from = a.emitted > sw.size() ? a.emitted - sw.size() : 0;
      const std::size_t p = a.text.find(sw, from);
      if (p != std::string::npos) cut = std::min(cut, p);
    }
    if (cut != std::string::npos) {
      a.text.resize(std::max(cut, a.emitted));
      // Tokens whose text begins past the cut are not part of the reply.
      while (a.logprobs.size() > a.lp_emitted &&
             a.logprobs.back().offset >= static_cast<std::int64_t>(a.text.size()))
        a.logprobs.pop_back();
      s.tail = {next};
      end_active(a, "stop", std::nullopt);
      continue;
    }
    if (a.generated >= a.job->req.max_tokens || seen >= o_.max_context) {
      s.tail = {next};
      end_active(a, "length", std::nullopt);
      continue;
    }
    std::size_t safe = a.text.size() - incomplete_utf8_tail(a.text);
    if (a.max_stop > 1) safe = a.text.size() > a.max_stop - 1 ? std::min(safe, a.text.size() - (a.max_stop - 1)) : 0;
    if (safe > a.emitted) {
      // With the text, the log probabilities of the tokens whose text begins in it.
      std::vector<TokenLogprob> lps;
      while (a.lp_emitted < a.logprobs.size() &&
             a.logprobs[a.lp_emitted].offset < static_cast<std::int64_t>(safe))
        lps.push_back(a.logprobs[a.lp_emitted++]);
      a.job->push(a.text.substr(a.emitted, safe - a.emitted), std::move(lps));
      a.emitted = safe;
    }
    {
      std::lock_guard jl(a.job->m_);
      a.job->completion_tokens_ = a.generated;
    }
  }
  counters_.tokens_generated += generated;
  const auto now = Clock::now();
  rate_.emplace_back(now, generated);
  while (!rate_.empty() && now - rate_.front().first > std::chrono::seconds(10)) rate_.pop_front();
  std::int64_t resident = 0;
  for (auto& sp : sessions_) resident += sp->resident;
  counters_.peak_kv_resident = std::max(counters_.peak_kv_resident, resident);
}

void Scheduler::drain(std::chrono::milliseconds grace) {
  std::unique_lock lock(m_);
  draining_ = true;
  cv_.notify_all();
  const auto until = Clock::now() + grace;
  while (!active_.empty() || !queue_.empty() || restoring_ > 0) {
    if (cv_.wait_until(lock, until) == std::cv_status::timeout) {
      abort_active_ = true;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(5),
                   [&] { return active_.empty() && queue_.empty() && restoring_ == 0; });
      return;
    }
  }
}

Metrics Scheduler::metrics() {
  std::int64_t specs = 0, measured = 0;
  {
    std::lock_guard fp(fp_m_);
    specs = static_cast<std::int64_t>(footprints_.size());
    measured = fp_measurements_;
  }
  std::lock_guard lock(m_);
  Metrics m = counters_;
  m.method_specs = specs;
  m.footprint_measurements = measured;
  for (auto& s : sessions_) {
    (s->busy ? m.sessions_active : m.sessions_idle) += 1;
    m.kv_resident += s->resident;
    m.kv_full += s->full;
  }
  m.kv_reserved = reserved_;
  m.persistent = store_ != nullptr;
  if (store_) m.store = store_->stats();
  m.queued = static_cast<std::int64_t>(queue_.size());
  std::int64_t tok = 0;
  for (auto& r : rate_) tok += r.second;
  if (!rate_.empty()) {
    const double span =
        std::max(1.0, std::chrono::duration<double>(Clock::now() - rate_.front().first).count());
    m.tokens_per_second = static_cast<double>(tok) / span;
  }
  return m;
}

}  // namespace vq::serve
