// The server's engine side: sessions (a conversation and its compressed cache), memory
// admission, and the scheduler thread that runs every active request's prefill chunks and
// decode steps together as batched forward steps (engine/model/transformer.h: one step over a
// batch of sequences, each with its own cache).
//
// Sessions. A chat request whose messages extend a live idle session's conversation exactly
// (the session's messages, its last the reply it generated, are a strict prefix of the request's,
// and the method is the same) continues that session: only the new messages are tokenized and
// run, over the cache as it is (compression is irreversible, so nothing else can reuse it).
// Otherwise a new session starts. A completion request always gets a new session, dropped at its
// end. A request that fails, is cancelled (client gone) or is cut short by shutdown frees its
// session.
//
// Sessions that survive (--session-dir, serve/session_store.h). Each chat turn's end copies
// the session's state (ModelCache::save_state) to the store, whose thread writes it as a file
// named by the conversation; the job finishes once the file is durable. A request that no live
// session continues looks up the files of its conversation's turns (latest first) once, at its
// first admission attempt, and restores the cache from the one it finds: a session dropped for
// room (spilled), saved by a server that restarted or by another replica, or a turn before a
// reply the client edited.
//
// Memory as a contract. Each session holds a reservation of its method's footprint
// (serve/footprint.h) from admission until it is dropped; the reservations together never
// exceed --kv-memory, so neither do the caches' resident bytes. A new session that does not fit
// first drops idle sessions, least recently used first; if it still does not fit (or
// --max-sessions are live) the request waits in a bounded queue (FIFO); a full queue answers 503
// at once, and a request that waits longer than the queue timeout gets 503 with Retry-After.
//
// Determinism. A session's prefill is cut into chunks of `chunk` tokens (the last shorter) and
// decodes one token a step whatever else runs; its sampler is seeded by the request; so its
// tokens are bit-identical to running it alone (tests/test_serve.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/model/model.h"
#include "engine/run/sampler.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine/run/chat_template.h"
#include "serve/session_store.h"
#include "veloxquant/builder.h"
#include "veloxquant/config.h"

namespace vq::serve {

// The chat templates live with the run loops (engine/run/chat_template.h), where `eval --task`
// uses them too.
using engine::ChatTemplate;
using engine::detect_template;
using engine::Message;
using engine::model_chat_template;
using engine::parse_template_name;
using engine::TemplateKind;

// An error with the HTTP status and OpenAI error type it is answered with.
struct ServeError {
  ServeError() = default;
  ServeError(int status_, std::string type_, std::string message_, std::string param_ = "",
             int retry_after_ = 0, std::string code_ = "")
      : status(status_),
        type(std::move(type_)),
        message(std::move(message_)),
        param(std::move(param_)),
        retry_after(retry_after_),
        code(std::move(code_)) {}
  int status = 500;
  std::string type = "server_error";  // invalid_request_error, server_error, ...
  std::string message;
  std::string param;    // the request field at fault ("" = none)
  int retry_after = 0;  // seconds, for 503 (0 = no header)
  std::string code;     // OpenAI's error code ("" = null), e.g. "unsupported_parameter"
};

struct SchedulerOptions {
  std::int64_t kv_memory = 0;       // bytes all sessions' reservations may hold together
  std::int64_t max_sessions = 64;   // live sessions (active + idle)
  std::int64_t max_context = 4096;  // positions a session may hold (<= the model's seq_len)
  std::int64_t chunk = 32;          // prefill tokens per session per step
  std::int64_t step_tokens = 256;   // tokens per batched step, all sessions together
  std::int64_t max_queue = 64;      // requests waiting for admission
  double queue_timeout_s = 30.0;    // longest wait in the queue before 503
  std::int64_t client_methods = 4;  // method specs one client may have measured and cached
  CacheConfig default_method = CacheConfig("full");
  // --methods-allowed: when non-empty, the only specs a request may name besides
  // default_method; all measured when the scheduler starts.
  std::vector<CacheConfig> methods_allowed;
  // --max-method-specs: the most specs known at once (measured or being measured; the default
  // and the allowed ones count).
  std::int64_t max_method_specs = 32;
  // --duo-pattern: the head pattern every session of a method with head types (duoattention)
  // gets; empty: none (such sessions estimate their heads from the prompt).
  HeadPattern head_pattern;
  // --session-dir: where every chat turn's session is written (serve/session_store.h), so a
  // session dropped for room, or held by a server that restarted or died, is restored when its
  // conversation goes on; "" = sessions live in memory only. --session-dir-bytes bounds it.
  std::string session_dir;
  std::int64_t session_dir_bytes = std::int64_t{4} << 30;
};

// What a request asks for (parsed and validated by serve/openai.h).
struct GenRequest {
  bool chat = true;
  std::vector<Message> messages;  // chat
  std::string prompt;             // completion
  std::int64_t max_tokens = 256;
  float temperature = 1.0f;
  float top_p = 1.0f;       // 0: greedy, like temperature 0
  std::uint64_t seed = 42;  // the sampler's xorshift state (nonzero)
  std::vector<std::string> stop;
  // OpenAI's penalties and logit bias (adjust_logits below), on the logits before sampling.
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::vector<std::pair<std::int32_t, float>> logit_bias;  // (token id, bias), ids ascending
  // Log probabilities of each generated token under the model's distribution (the softmax of
  // the raw logits: before penalties, bias, temperature and top_p), with the `top_logprobs`
  // most probable tokens of each step (0..20).
  bool logprobs = false;
  int top_logprobs = 0;
  CacheConfig method = CacheConfig("full");
  std::string client;  // who asks (the server: the remote address); "" = no per-client limit
};

// OpenAI's frequency and presence penalties and logit bias, in place on one step's logits:
// for each token j generated counts[j] = c > 0 times so far in this completion,
// logits[j] -= c * frequency + presence (in float, that expression evaluated first); then
// logits[j] += bias for each (j, bias) of `bias`. Ids are within [0, vocab) (unchecked).
void adjust_logits(float* logits, const std::map<std::int32_t, std::int64_t>& counts,
                   float frequency, float presence,
                   const std::vector<std::pair<std::int32_t, float>>& bias);

// One generated token's log probability (GenRequest::logprobs).
struct TokenLogprob {
  // Its text as the reply received it (raw bytes: may be part of a UTF-8 sequence).
  std::string token;
  float logprob = 0;             // log softmax of the raw logits at this step
  std::int64_t offset = 0;       // byte offset of its text in the reply
  std::int64_t text_offset = 0;  // the same in code points (UTF-8 lead bytes before it)
  // The top_logprobs most probable tokens (text, logprob), descending (ties: lower id first).
  std::vector<std::pair<std::string, float>> top;
};

// Wakes a reader that waits on several jobs (the n choices of one request).
struct Wake {
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t seq = 0;
  void notify() {
    {
      std::lock_guard lock(m);
      ++seq;
    }
    cv.notify_all();
  }
  // Waits up to `timeout` for a notify after the one that made seq == `seen`.
  void wait(std::uint64_t seen, std::chrono::milliseconds timeout) {
    std::unique_lock lock(m);
    cv.wait_for(lock, timeout, [&] { return seq != seen; });
  }
  std::uint64_t current() {
    std::lock_guard lock(m);
    return seq;
  }
};

// One request in flight: written by the scheduler, read by the HTTP thread that waits on it.
class Job {
 public:
  explicit Job(GenRequest r, std::shared_ptr<Wake> wake = nullptr)
      : req(std::move(r)), wake_(std::move(wake)) {}
  const GenRequest req;

  // Output so far (text pieces in order), taken by the reader.
  struct Snapshot {
    std::string text;              // new text since the last take
    std::vector<TokenLogprob> logprobs;  // the tokens whose text begins in `text` (logprobs)
    bool admitted = false;         // left the queue (or failed there)
    bool done = false;             // finished (normally or with an error)
    std::string finish_reason;     // "stop", "length" (when done without error; a request
                                   // cut by shutdown fails with 503 instead)
    std::optional<ServeError> error;
    std::int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    std::string session;           // the session's id
    std::int64_t kv_resident = 0, kv_full = 0, kv_reserved = 0;
    std::int64_t kv_payload = 0;   // the session's K/V payload (CacheStats::kept_bytes)
  };
  // Waits up to `timeout` for news (text, admission, end) and takes what is new.
  Snapshot take(std::chrono::milliseconds timeout);
  // The reader is gone (client disconnected): the scheduler ends the job and frees its session.
  void cancel() noexcept { cancelled_ = true; }
  bool cancelled() const noexcept { return cancelled_; }

 private:
  friend class Scheduler;
  void push(const std::string& text, std::vector<TokenLogprob> logprobs = {});
  void notify();
  void finish(const std::string& reason);
  void fail(ServeError e);
  void set_admitted();

  std::mutex m_;
  std::condition_variable cv_;
  std::string pending_;
  std::vector<TokenLogprob> pending_logprobs_;
  std::shared_ptr<Wake> wake_;
  bool admitted_ = false, done_ = false, news_ = false;
  std::string finish_reason_;
  std::optional<ServeError> error_;
  std::atomic<bool> cancelled_{false};
  // Statistics, written under m_.
  std::int64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0;
  std::string session_;
  std::int64_t kv_resident_ = 0, kv_full_ = 0, kv_reserved_ = 0, kv_payload_ = 0;
  std::chrono::steady_clock::time_point queued_at_ = std::chrono::steady_clock::now();
  std::int64_t need_ = 0;  // the method's footprint, measured at submit
  // --session-dir: the saved turns this request could continue (files, latest first), looked
  // up once (stat only) at its first admission attempt.
  bool looked_up_ = false;
  std::vector<std::pair<std::string, std::size_t>> restore_from_;
};

struct Metrics {
  std::int64_t sessions_active = 0, sessions_idle = 0, queued = 0;
  std::int64_t kv_resident = 0;   // sum of live sessions' resident_bytes
  std::int64_t kv_full = 0;       // what a full fp16 cache would hold for their tokens
  std::int64_t kv_reserved = 0;   // sum of reservations
  std::int64_t kv_memory = 0;     // --kv-memory
  std::int64_t tokens_generated = 0, tokens_prefilled = 0, steps = 0;
  // kvzip: reconstruction passes run after a session's prompt, and their wall time (seconds).
  std::int64_t reconstructions = 0;
  double reconstruction_seconds = 0;
  double tokens_per_second = 0;   // generated tokens/s over the last ~10 s
  std::int64_t footprint_exceeded = 0;  // steps after which a session held more than reserved
  std::int64_t requests_rejected = 0, sessions_evicted = 0, sessions_reused = 0;
  std::int64_t requests_cancelled = 0;  // ended (queued or running): the client went away
  std::int64_t peak_kv_resident = 0;    // the most resident bytes all sessions held at once
  // --session-dir: idle sessions dropped for room whose state is on disk, sessions restored
  // from disk (any turn), of which from a turn before the request's last reply (the client
  // edited it: a snapshot hit), session files that failed to restore (removed), and the
  // store's own counters.
  std::int64_t sessions_spilled = 0, sessions_restored = 0, snapshot_hits = 0;
  std::int64_t session_restore_errors = 0;
  SessionStoreStats store;
  bool persistent = false;                 // --session-dir is set
  std::int64_t method_specs = 0;           // specs known now (measured or being measured)
  std::int64_t footprint_measurements = 0; // footprints measured since start (startup included)
};

class Scheduler {
 public:
  // The model and tokenizer must outlive the scheduler. Throws Error(kInvalidArgument) for
  // options that cannot work (max_context past seq_len, chunk < 1, ...). Starts the thread.
  Scheduler(const engine::Model& model, const engine::Tokenizer& tokenizer,
            const ChatTemplate& chat, SchedulerOptions options);
  ~Scheduler();  // stops the thread; unfinished jobs fail with 503
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a job. Throws ServeError: 400 when the method's footprint can never fit
  // --kv-memory, 503 (Retry-After) when the queue is full or the server is draining.
  void submit(const std::shared_ptr<Job>& job);

  // The reservation a session of `method` takes (past --kv-memory the measurement stops and
  // returns a value above it). The default method and every spec of options().methods_allowed
  // are measured when the scheduler starts (the constructor throws Error naming
  // --methods-allowed for one that cannot be measured or can never fit --kv-memory). With
  // methods_allowed non-empty any other spec is refused: ServeError 400 naming
  // veloxquant.method. Otherwise a new spec is measured once on the scheduler's measuring
  // thread (neither the scheduler thread nor the caller's), and the caller waits for it, at most
  // options().queue_timeout_s (then 503 + Retry-After) or until `cancelled` is set (then 503);
  // concurrent callers naming the same new spec share one measurement; the rest of the server
  // goes on meanwhile. Known specs: at most options().max_method_specs; past it, the least
  // recently used measured spec that is neither the default nor allowed is dropped (measured
  // again when asked again), and when none can be dropped (all slots are startup specs or
  // measurements in progress) a new spec gets ServeError 429 (rate_limit_exceeded, code
  // "method_specs_full", Retry-After 1) naming --max-method-specs. One client (non-empty
  // `client`) holds at most options().client_methods specs, its own least recently used dropped
  // first (429 likewise when all of its are being measured), so no client can fill the cache and
  // lock the others out (issue 33). A spec whose measurement fails (a method that does not fit
  // the model) is ServeError 400 naming veloxquant.method, and not kept. Sessions keep their
  // reservation whatever happens to the cache.
  std::int64_t footprint(const CacheConfig& method, const std::string& client = "",
                         const std::atomic<bool>* cancelled = nullptr);
  // How many specs the cache holds now (measured or being measured), and how many of them
  // `client` asked for.
  std::size_t cached_methods(const std::string& client = "");

  // Stops admitting (queued jobs fail with 503), lets active jobs finish, then returns once
  // none is active or `grace` has passed (the rest then fail with 503 "the server shut down
  // before the reply was finished": OpenAI has no finish reason for it).
  void drain(std::chrono::milliseconds grace);

  Metrics metrics();
  const SchedulerOptions& options() const noexcept { return o_; }

 private:
  struct Session;
  struct Active;
  void loop();
  // Admission of a queued job: reuse a session whose conversation the request extends, or
  // tokenize the prompt, make room (dropping idle sessions LRU-first) and open a new session;
  // then start it. True: admitted (or failed with the job told why); false: wait in the queue.
  bool admit_locked(const std::shared_ptr<Job>& job);
  // An idle chat session of the same method whose messages the request's extend, still fitting
  // --max-context with the new turn: a.s and a.feed (its pending tail and the new messages).
  bool reuse_session_locked(const GenRequest& r, const std::string& spec, Active& a);
  // A new session's prompt tokens (BOS for an empty prompt); throws ServeError 400 past
  // --max-context (or with neither prompt nor BOS).
  std::vector<std::int32_t> prompt_tokens(const GenRequest& r) const;
  // Whether `need` bytes and one more session fit, dropping idle sessions (least recently used
  // first) when that makes them fit; false (nothing dropped) when even that would not.
  bool make_room_locked(std::int64_t need);
  Session* new_session_locked(const GenRequest& r, const std::string& spec, std::int64_t need);
  // A new session's cache: the method's, set up as every session's is (head pattern, kvzip's
  // reconstruction, the --max-context memory hint).
  ModelCache session_cache(const CacheConfig& method) const;
  // --session-dir. Restoring reads a file and loads a cache (tens of milliseconds per 10 MB), so
  // it runs on the restore thread, never on the scheduler thread: admission reserves the
  // session's memory, marks it busy and hands (job, session) over; the restore thread tries the
  // job's files latest first (a damaged one is removed and counted) and hands the outcome back;
  // the scheduler then starts the job on the restored session, or on the fresh session when no
  // file could be used.
  struct Restoring {
    std::shared_ptr<Job> job;
    Session* s = nullptr;
    bool ok = false;
    std::int64_t errors = 0;  // files that could not be restored
    SessionRecord meta;       // the restored turn (its state moved into the cache)
  };
  void restore_loop();
  void finish_restore_locked(Restoring& w);
  // The tokens that continue session `s` with request `r`'s messages past s's history: its
  // pending tail, the close of its last turn, the new messages rendered.
  std::vector<std::int32_t> continuation(const Session& s, const GenRequest& r) const;
  // Marks the session busy, sets the sampler and the job's counters, and makes `a` active.
  void start_locked(std::unique_ptr<Active> a, std::int64_t cached);
  void step(std::vector<Active*>& run);
  // Removes the queued jobs whose readers cancelled them (counted in requests_cancelled).
  void drop_cancelled_queued_locked();
  void drop_session_locked(Session* s);
  void end_active(Active& a, const std::string& reason, std::optional<ServeError> err);

  const engine::Model* model_;
  const engine::Tokenizer* tok_;
  const ChatTemplate* chat_;
  SchedulerOptions o_;
  std::int32_t stop_token_;  // the model's own stop token (generate.h's rule)
  // The engine's one forward, over the step's sessions. Its limits are the context's, not the
  // prefill chunk's: a session's step still takes at most --prefill-chunk tokens, and the room
  // above is for kvzip's reconstruction steps (Transformer::reconstruct), which run between the
  // batched steps, one session at a time.
  engine::Transformer forward_;
  engine::RepeatPrompt repeat_;  // kvzip's reconstruction instruction in the model's tokenizer
  // Tokens a session's next prefill step takes: --prefill-chunk, or the rest of its feed; for a
  // cache that waits for a reconstruction pass (kvzip) one fewer where that would leave a last
  // step of one token (a single-token step is decode to the cache, refused while the prompt
  // waits).
  std::int64_t prefill_take(const Active& a) const;

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::list<std::unique_ptr<Session>> sessions_;  // front = most recently used
  std::list<std::unique_ptr<Active>> active_;     // in admission order
  // The footprint cache. fp_m_ guards footprints_, fp_lru_, fp_work_, fp_stop_ and
  // fp_measurements_; it is never held while measuring, nor together with m_.
  std::mutex fp_m_;
  std::condition_variable fp_work_cv_;  // the measuring thread: work queued or stopping
  std::condition_variable fp_done_cv_;  // waiters: a measurement finished (or failed)
  struct Measured {
    std::string spec;
    CacheConfig method = CacheConfig("full");
    std::int64_t bytes = 0;
    bool ready = false;                    // measured
    bool pinned = false;                   // the default or an allowed spec: never dropped
    std::string error;                     // the measurement failed (the entry is gone)
    std::string client;                    // who had it measured
    std::list<std::string>::iterator lru;  // its place in fp_lru_
  };
  std::map<std::string, std::shared_ptr<Measured>> footprints_;  // spec -> its measurement
  std::list<std::string> fp_lru_;                                // specs, most recently used first
  std::deque<std::shared_ptr<Measured>> fp_work_;                // waiting to be measured
  bool fp_stop_ = false;
  std::int64_t fp_measurements_ = 0;
  std::int64_t measure(const CacheConfig& method) const;
  void measure_loop();
  std::thread fp_thread_;
  std::int64_t reserved_ = 0;
  std::int64_t next_session_ = 1;
  std::size_t rr_ = 0;  // round-robin start when a step cannot take every session
  bool draining_ = false, stopping_ = false, abort_active_ = false;
  Metrics counters_;
  std::unique_ptr<SessionStore> store_;  // --session-dir (null without)
  std::deque<Restoring> restore_work_, restore_done_;  // guarded by m_
  std::int64_t restoring_ = 0;                         // handed over, not yet started
  std::condition_variable restore_cv_;
  std::thread restore_thread_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::int64_t>> rate_;  // tokens
  std::thread thread_;
};

}  // namespace vq::serve
