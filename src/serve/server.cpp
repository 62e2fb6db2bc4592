#include "serve/server.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "engine/model/model.h"
#include "engine/model/transformer.h"
#include "engine/run/chat_template.h"
#include "engine/tokenizers/tokenizer.h"
#include "serve/http.h"
#include "serve/openai.h"
#include "veloxquant/errors.h"

namespace vq::serve {

namespace {
using json = nlohmann::json;
using namespace std::chrono_literals;

http::Response error_response(const ServeError& e) {
  http::Response res;
  res.status = e.status;
  if (e.retry_after > 0) res.set_header("Retry-After", std::to_string(e.retry_after));
  res.content_type = "application/json";
  res.body = error_json(e);
  return res;
}

std::int64_t process_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

std::string metrics_text(const Metrics& m, const http::Stats& h) {
  std::ostringstream o;
  auto gauge = [&](const char* name, const char* help, auto value, const char* type = "gauge") {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
      << name << " " << value << "\n";
  };
  o << "# HELP veloxquant_sessions Live sessions (a conversation and its cache) by state\n"
       "# TYPE veloxquant_sessions gauge\n"
    << "veloxquant_sessions{state=\"active\"} " << m.sessions_active << "\n"
    << "veloxquant_sessions{state=\"idle\"} " << m.sessions_idle << "\n";
  gauge("veloxquant_queued_requests", "Requests waiting for K/V memory", m.queued);
  gauge("veloxquant_tokens_per_second", "Generated tokens per second over the last 10 s",
        m.tokens_per_second);
  gauge("veloxquant_kv_resident_bytes", "K/V cache bytes the live sessions hold (resident_bytes)",
        m.kv_resident);
  gauge("veloxquant_kv_full_bytes",
        "Bytes a full fp16 cache would hold for the same sessions' tokens", m.kv_full);
  gauge("veloxquant_kv_reserved_bytes", "Sum of the live sessions' footprint reservations",
        m.kv_reserved);
  gauge("veloxquant_kv_memory_bytes", "The --kv-memory limit", m.kv_memory);
  gauge("veloxquant_kv_peak_resident_bytes", "Most K/V bytes all sessions held at once",
        m.peak_kv_resident);
  gauge("veloxquant_process_resident_bytes", "The process's resident set size",
        process_rss_bytes());
  gauge("veloxquant_generated_tokens_total", "Tokens generated", m.tokens_generated, "counter");
  gauge("veloxquant_prefill_tokens_total", "Prompt tokens run", m.tokens_prefilled, "counter");
  gauge("veloxquant_reconstructions_total",
        "kvzip reconstruction passes run after a session's prompt", m.reconstructions, "counter");
  gauge("veloxquant_reconstruction_seconds_total",
        "Wall time of those passes (against the prompt steps they follow)",
        m.reconstruction_seconds, "counter");
  gauge("veloxquant_batch_steps_total", "Batched forward steps", m.steps, "counter");
  gauge("veloxquant_requests_rejected_total", "Requests answered 503 (queue full, timeout, "
        "shutdown)", m.requests_rejected, "counter");
  gauge("veloxquant_requests_cancelled_total", "Requests ended because the client went away",
        m.requests_cancelled, "counter");
  gauge("veloxquant_sessions_evicted_total", "Idle sessions dropped to make room",
        m.sessions_evicted, "counter");
  gauge("veloxquant_sessions_reused_total", "Requests that continued a live session's cache",
        m.sessions_reused, "counter");
  if (m.persistent) {
    gauge("veloxquant_sessions_spilled_total",
          "Idle sessions dropped for room whose last turn is in --session-dir",
          m.sessions_spilled, "counter");
    gauge("veloxquant_sessions_restored_total",
          "Requests that continued a session restored from --session-dir", m.sessions_restored,
          "counter");
    gauge("veloxquant_session_snapshot_hits_total",
          "Of those, restored from a turn before the request's last reply (an edited reply)",
          m.snapshot_hits, "counter");
    gauge("veloxquant_session_restore_errors_total",
          "Session files that could not be restored (damaged or unusable; removed)",
          m.session_restore_errors, "counter");
    gauge("veloxquant_session_writes_total", "Turns written to --session-dir", m.store.writes,
          "counter");
    gauge("veloxquant_session_write_errors_total", "Turns whose file could not be written",
          m.store.write_errors, "counter");
    gauge("veloxquant_session_writes_skipped_total",
          "Turns not written (writer too far behind, or a file past --session-dir-bytes)",
          m.store.skipped, "counter");
    gauge("veloxquant_session_files_removed_total",
          "Oldest session files removed to keep --session-dir within --session-dir-bytes",
          m.store.removed, "counter");
    gauge("veloxquant_session_files", "Session files in --session-dir (at the last write)",
          m.store.files);
    gauge("veloxquant_session_dir_bytes", "Bytes of those files", m.store.bytes);
  }
  gauge("veloxquant_method_specs", "Method specs known now (measured or being measured)",
        m.method_specs);
  gauge("veloxquant_footprint_measurements_total",
        "Footprints measured since start (the startup specs included)", m.footprint_measurements,
        "counter");
  gauge("veloxquant_kv_footprint_exceeded_total",
        "Steps after which a session held more than its reservation (should stay 0)",
        m.footprint_exceeded, "counter");
  // The HTTP layer (src/serve/http.h).
  gauge("veloxquant_http_connections", "Open HTTP connections", h.connections_open.load());
  gauge("veloxquant_http_connections_total", "HTTP connections accepted (not counting those "
        "refused at a cap)", h.connections_total.load(), "counter");
  o << "# HELP veloxquant_http_connections_refused_total Connections answered 503 at accept by "
       "a cap\n# TYPE veloxquant_http_connections_refused_total counter\n"
    << "veloxquant_http_connections_refused_total{cap=\"total\"} "
    << h.rejected_total - h.rejected_per_address << "\n"
    << "veloxquant_http_connections_refused_total{cap=\"per_address\"} "
    << h.rejected_per_address << "\n";
  o << "# HELP veloxquant_http_timeouts_total Connections closed for a missed deadline\n"
       "# TYPE veloxquant_http_timeouts_total counter\n"
    << "veloxquant_http_timeouts_total{phase=\"header\"} " << h.header_timeouts << "\n"
    << "veloxquant_http_timeouts_total{phase=\"body\"} " << h.body_timeouts << "\n"
    << "veloxquant_http_timeouts_total{phase=\"write\"} " << h.write_timeouts << "\n"
    << "veloxquant_http_timeouts_total{phase=\"keep_alive\"} " << h.keep_alive_closed << "\n";
  gauge("veloxquant_http_keep_alive_limit_total",
        "Connections closed after --keep-alive-requests responses", h.keep_alive_limit.load(),
        "counter");
  gauge("veloxquant_http_bad_requests_total",
        "Requests refused by the HTTP layer (400 malformed, 413 body, 431 head)",
        h.bad_requests.load(), "counter");
  gauge("veloxquant_http_workers_busy", "Generation requests on the --http-workers pool",
        h.workers_busy.load());
  gauge("veloxquant_http_workers_refused_total", "Requests answered 503: every worker busy",
        h.workers_refused.load(), "counter");
  return o.str();
}

// One choice of a streamed request.
struct StreamChoice {
  std::shared_ptr<Job> job;
  bool first = true, finished = false;
  std::string carry;                   // text taken while waiting for admission
  std::vector<TokenLogprob> carry_lp;  // and its tokens' log probabilities
  Job::Snapshot last;
};

struct StreamState {
  std::vector<StreamChoice> choices;
  std::shared_ptr<Wake> wake;
  std::string id, model;
  std::int64_t created = 0;
  bool chat = true, include_usage = false, logprobs = false;
  std::shared_ptr<http::Exchange> ex;  // the request and its connection
  void cancel_all() {
    for (auto& c : choices) c.job->cancel();
  }
};

// What the handlers share.
struct ServerState {
  const ServeOptions& o;
  const CacheConfig& method;  // --method: the default of requests that name none
  std::int64_t max_context = 0;
  std::string model_name;  // the checkpoint's file name (/v1/models, responses)
  Scheduler& sched;
  std::atomic<bool> draining{false};
  http::Server* http_server = nullptr;  // its counters (/metrics)
  std::atomic<std::int64_t> next_id{1};
  std::int64_t vocab_size = 0;           // logit_bias ids are checked against it
  const engine::Model* model = nullptr;  // its mapped files are checked per request (issue 33)
};

// --methods-allowed "SPEC;SPEC...": ';' separates (a spec has ',' and ':' but never ';');
// blanks around a spec and empty items (a trailing ';') are ignored. A spec that does not
// parse is an Error naming the flag and the spec.
std::vector<CacheConfig> parse_methods_allowed(const std::string& list) {
  std::vector<CacheConfig> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    std::size_t end = list.find(';', at);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(at, end - at);
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    if (!item.empty()) {
      try {
        out.push_back(CacheConfig::parse(item));
      } catch (const Error& x) {
        throw Error(ErrorCode::kInvalidArgument,
                    "--methods-allowed: spec '" + item +
                        "' is not a method spec (expected e.g. 'h2o:budget=512', specs separated "
                        "by ';'): " + x.what());
      }
    }
    at = end + 1;
  }
  if (!list.empty() && out.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "--methods-allowed: expected one or more method specs separated by ';', got '" +
                    list + "'");
  }
  return out;
}

// The scheduler's options from the flags; --max-context past the model's context is refused.
SchedulerOptions scheduler_options(const ServeOptions& o, const CacheConfig& method,
                                   const engine::Model& model) {
  const engine::ModelConfig& mc = model.config();
  SchedulerOptions so;
  so.kv_memory = o.kv_memory;
  so.max_sessions = o.max_sessions;
  so.max_context = o.max_context == 0 ? std::min<std::int64_t>(4096, mc.seq_len) : o.max_context;
  so.chunk = o.chunk;
  so.step_tokens = o.step_tokens;
  so.max_queue = o.max_queue;
  so.queue_timeout_s = o.queue_timeout_s;
  so.client_methods = o.client_methods;
  so.default_method = method;
  so.max_method_specs = o.max_method_specs;
  so.methods_allowed = parse_methods_allowed(o.methods_allowed);
  so.session_dir = o.session_dir;
  so.session_dir_bytes = o.session_dir_bytes;
  if (!o.head_pattern.empty()) so.head_pattern = load_head_pattern(o.head_pattern, mc.n_layers, mc.n_kv_heads);
  if (so.max_context > mc.seq_len) {
    throw Error(ErrorCode::kInvalidArgument,
                "--max-context " + std::to_string(so.max_context) + " is past the model's context (" +
                    std::to_string(mc.seq_len) + " positions in " + model.path() + ")");
  }
  return so;
}

// The methods a known path answers (the Allow header of its 405), nullptr for an unknown path.
const char* allowed_methods(const std::string& path) {
  if (path == "/v1/chat/completions" || path == "/v1/completions") return "POST, OPTIONS";
  if (path == "/v1/models" || path == "/health" || path == "/metrics" || path == "/")
    return "GET, HEAD, OPTIONS";
  return nullptr;
}

bool method_allowed(const std::string& method, const std::string& allow) {
  std::size_t at = 0;
  while (at < allow.size()) {
    std::size_t end = allow.find(',', at);
    if (end == std::string::npos) end = allow.size();
    if (allow.compare(at, end - at, method) == 0) return true;
    at = end + 2;  // ", "
  }
  return false;
}

// The CORS origin to answer `req` with: "" when --cors-origin is not given or does not list
// the request's Origin; "*" when it lists "*".
std::string cors_origin(const ServeOptions& o, const http::Request& req) {
  if (o.cors_origins.empty() || !req.has_header("Origin")) return "";
  const std::string origin = req.header("Origin");
  for (const auto& allowed : o.cors_origins) {
    if (allowed == "*") return "*";
    if (allowed == origin) return origin;
  }
  return "";
}

// On the I/O thread, for every request: CORS (opt-in), OPTIONS and 405 for a known path's
// methods, the API key on /v1/, then the routes that never wait (/health, /metrics,
// /v1/models, the page, 404) answered here; the two generation routes go to a worker (false).
bool dispatch(ServerState& state, const http::Request& req, http::Headers& common,
              http::Response& res) {
  const ServeOptions& o = state.o;
  const std::string origin = cors_origin(o, req);
  if (!origin.empty()) {
    common.emplace_back("Access-Control-Allow-Origin", origin);
    common.emplace_back("Access-Control-Expose-Headers", "Retry-After");
  }
  if (!o.cors_origins.empty()) common.emplace_back("Vary", "Origin");
  const char* allow = allowed_methods(req.path);
  if (allow != nullptr && req.method == "OPTIONS") {
    // A CORS preflight (or a plain OPTIONS): answered before the key check, which a
    // preflight cannot pass (browsers send it without the Authorization header).
    res.status = 204;
    res.set_header("Allow", allow);
    if (!origin.empty()) {
      res.set_header("Access-Control-Allow-Methods", allow);
      const std::string asked = req.header("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? std::string("Authorization, Content-Type") : asked);
      res.set_header("Access-Control-Max-Age", "600");
    }
    return true;
  }
  if (allow != nullptr && !method_allowed(req.method, allow)) {
    res = error_response(ServeError{405, "invalid_request_error",
                                    req.method.substr(0, 16) + " is not allowed on " + req.path +
                                        " (allowed: " + allow + ")",
                                    "", 0});
    res.set_header("Allow", allow);
    return true;
  }
  if (!o.api_key.empty() && req.path.rfind("/v1/", 0) == 0 &&
      req.header("Authorization") != "Bearer " + o.api_key) {
    res = error_response(ServeError{401, "invalid_request_error",
                                    "missing or wrong API key (send Authorization: Bearer KEY)",
                                    "", 0});
    return true;
  }
  if (req.path == "/v1/chat/completions" || req.path == "/v1/completions") return false;
  if (req.path == "/v1/models") {
    json j = {{"object", "list"},
              {"data", json::array({{{"id", state.model_name},
                                     {"object", "model"},
                                     {"created", 0},
                                     {"owned_by", "veloxquant"}}})}};
    res.content_type = "application/json";
    res.body = dump(j);
  } else if (req.path == "/health") {
    res.content_type = "application/json";
    if (state.draining) {
      res.status = 503;
      res.body = R"({"status":"draining"})";
    } else {
      res.body = R"({"status":"ok"})";
    }
  } else if (req.path == "/metrics") {
    // The scheduler's counters are copied under its lock, which a step holds only for its
    // bookkeeping, never for its forward.
    res.content_type = "text/plain; version=0.0.4";
    res.body = metrics_text(state.sched.metrics(), state.http_server->stats());
  } else if (req.path == "/") {
    res.content_type = "text/html; charset=utf-8";
    res.body = chat_page_html();
  } else {
    res = error_response(
        ServeError{404, "invalid_request_error", "no such endpoint: " + req.path.substr(0, 64), "",
                   0});
  }
  return true;
}

// Answers a streamed request with server-sent events: each choice's text as it comes (chunks
// with its index, its tokens' log probabilities when asked), then its last chunk with
// finish_reason, then (stream_options.include_usage) a chunk with no choices and the usage,
// then [DONE]. Without include_usage a choice's last chunk carries the usage of that choice
// (an extension, as before). An error ends the stream with an error event and [DONE] (the
// other choices are cancelled). A client gone (closed, reset, or not reading within
// --write-timeout) cancels the jobs.
void stream_reply(const std::shared_ptr<StreamState>& st) {
  http::Exchange& ex = *st->ex;
  http::Response head;
  head.content_type = "text/event-stream";
  head.set_header("Cache-Control", "no-cache");
  if (!ex.begin_stream(std::move(head))) {
    st->cancel_all();
    return;
  }
  auto send = [&](const json& data) {
    return ex.send_chunk("data: " + (data.is_string() ? data.get<std::string>() : dump(data)) +
                         "\n\n");
  };
  for (;;) {
    const std::uint64_t seen = st->wake->current();
    bool ok = true, news = false, all_done = true;
    std::optional<ServeError> error;
    for (std::size_t i = 0; i < st->choices.size() && ok && !error; ++i) {
      StreamChoice& c = st->choices[i];
      if (c.finished) continue;
      Job::Snapshot s = c.job->take(std::chrono::milliseconds(0));
      std::string text = std::move(c.carry) + s.text;
      std::vector<TokenLogprob> lps = std::move(c.carry_lp);
      for (auto& e : s.logprobs) lps.push_back(std::move(e));
      c.carry.clear();
      c.carry_lp.clear();
      if (!text.empty() || !lps.empty() || c.first) {
        json chunk = chunk_json(st->id, st->chat, st->model, st->created, static_cast<int>(i),
                                text, st->logprobs && !lps.empty() ? &lps : nullptr, nullptr, s,
                                c.first);
        if (st->include_usage) chunk["usage"] = nullptr;
        ok = send(chunk);
        c.first = false;
        news = true;
      }
      if (!s.done) {
        all_done = false;
        continue;
      }
      if (s.error) {
        error = s.error;
        break;
      }
      json last = chunk_json(st->id, st->chat, st->model, st->created, static_cast<int>(i), "",
                             nullptr, s.finish_reason.c_str(), s, false);
      last["usage"] = st->include_usage ? json(nullptr) : usage_json({s});
      ok = ok && send(last);
      c.finished = true;
      c.last = s;
      news = true;
    }
    if (ok && error) {
      st->cancel_all();
      if (send(json(error_json(*error))) && send(json("[DONE]"))) ex.end_stream();
      return;
    }
    if (ok && all_done) {
      if (st->include_usage) {
        std::vector<Job::Snapshot> snaps;
        for (const auto& c : st->choices) snaps.push_back(c.last);
        ok = send(json{{"id", st->id},
                       {"object", st->chat ? "chat.completion.chunk" : "text_completion"},
                       {"created", st->created},
                       {"model", st->model},
                       {"choices", json::array()},
                       {"usage", usage_json(snaps)}});
      }
      if (ok && send(json("[DONE]"))) ex.end_stream();
      return;
    }
    if (!ok || ex.gone()) {
      st->cancel_all();
      return;
    }
    if (!news) st->wake->wait(seen, 100ms);  // the exchange's on_gone wakes it too
  }
}

// POST /v1/chat/completions (chat_endpoint) or /v1/completions, on a worker: parse the body
// (read whole by the HTTP layer, --max-body its only limit whatever the Content-Type; a
// multipart body is refused with 415: the API takes JSON), queue, wait for admission and, for a
// stream, its first token (errors keep their status: a model whose first output is not finite
// answers 500, not a 200 stream holding an error), then the whole reply or a stream.
void handle_generate(ServerState& state, bool chat_endpoint,
                     const std::shared_ptr<http::Exchange>& ex) {
  const http::Request& req = ex->request();
  auto send_error = [&](const ServeError& e) { ex->respond(error_response(e)); };
  if (req.header("Content-Type").rfind("multipart/form-data", 0) == 0) {
    send_error(ServeError{415, "invalid_request_error",
                          "multipart/form-data bodies are not accepted; send the request as "
                          "JSON (Content-Type: application/json)",
                          "", 0});
    return;
  }
  if (state.draining) {
    send_error(ServeError{503, "server_error", "the server is shutting down", "", 1});
    return;
  }
  // A model file truncated under its mapping would kill the process (SIGBUS): refused instead.
  if (const std::string changed = state.model ? state.model->file_change() : ""; !changed.empty()) {
    send_error(ServeError{503, "server_error", changed + "; restart the server", "", 0});
    return;
  }
  ParsedRequest p;
  try {
    p = parse_request(req.body, chat_endpoint, state.method, state.max_context, state.vocab_size);
  } catch (const ServeError& e) {
    send_error(e);
    return;
  }
  p.gen.client = req.remote_addr;  // the per-client method-spec budget (--client-methods)
  // The n choices: a job each (its own session and seed), woken together.
  auto wake = std::make_shared<Wake>();
  std::vector<std::shared_ptr<Job>> jobs;
  auto cancel_all = [&] {
    for (auto& j : jobs) j->cancel();
  };
  for (int i = 0; i < p.n; ++i) {
    GenRequest g = p.gen;
    g.seed = choice_seed(p.gen.seed, i);
    auto job = std::make_shared<Job>(std::move(g), wake);
    try {
      state.sched.submit(job);
    } catch (const ServeError& e) {
      cancel_all();
      send_error(e);
      return;
    } catch (const Error& e) {
      cancel_all();
      send_error(ServeError{400, "invalid_request_error", e.what(), "veloxquant.method", 0});
      return;
    }
    jobs.push_back(std::move(job));
  }
  // A client that goes away while the request waits (queued, generating, streaming) cancels
  // its jobs at once: the HTTP layer sees the connection's end of file or reset (or a write
  // past --write-timeout) and runs this; the scheduler drops a queued job from the queue or
  // ends a running one after the current step and frees its session.
  ex->on_gone([jobs, wake] {
    for (auto& j : jobs) j->cancel();
    wake->notify();
  });
  // Wait for choice 0's admission and, for a stream, its first token (or its end).
  std::vector<std::string> carry(jobs.size());
  std::vector<std::vector<TokenLogprob>> carry_lp(jobs.size());
  std::vector<Job::Snapshot> snap(jobs.size());
  auto take = [&](std::size_t i, std::chrono::milliseconds t) {
    snap[i] = jobs[i]->take(t);
    carry[i] += snap[i].text;
    for (auto& e : snap[i].logprobs) carry_lp[i].push_back(std::move(e));
  };
  for (;;) {
    take(0, 100ms);
    if (snap[0].done ||
        (snap[0].admitted && (!p.stream || !carry[0].empty() || snap[0].completion_tokens > 0)))
      break;
    if (ex->gone()) return;  // nobody reads an answer
  }
  if (snap[0].error) {
    cancel_all();
    send_error(*snap[0].error);
    return;
  }
  const std::int64_t created = static_cast<std::int64_t>(std::time(nullptr));
  const std::string id = (chat_endpoint ? "chatcmpl-" : "cmpl-") + std::to_string(state.next_id++);
  if (!p.stream) {
    std::vector<ChoiceOutput> out(jobs.size());
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      while (!snap[i].done) {
        take(i, 100ms);
        if (!snap[i].done && ex->gone()) return;
      }
      if (snap[i].error) {
        cancel_all();
        send_error(*snap[i].error);
        return;
      }
      out[i] = ChoiceOutput{std::move(carry[i]), std::move(carry_lp[i]), snap[i]};
    }
    http::Response res;
    res.content_type = "application/json";
    res.body =
        dump(completion_json(id, chat_endpoint, state.model_name, created, out, p.gen.logprobs));
    ex->respond(std::move(res));
    return;
  }
  auto st = std::make_shared<StreamState>();
  st->ex = ex;
  st->wake = wake;
  st->id = id;
  st->model = state.model_name;
  st->created = created;
  st->chat = chat_endpoint;
  st->include_usage = p.include_usage;
  st->logprobs = p.gen.logprobs;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    StreamChoice c;
    c.job = jobs[i];
    c.carry = std::move(carry[i]);
    c.carry_lp = std::move(carry_lp[i]);
    st->choices.push_back(std::move(c));
  }
  stream_reply(st);
}

// The HTTP layer's limits from the flags.
http::Limits http_limits(const ServeOptions& o) {
  http::Limits l;
  l.header_timeout_s = o.header_timeout_s;
  l.body_timeout_s = o.body_timeout_s;
  l.keep_alive_timeout_s = o.keep_alive_timeout_s;
  l.write_timeout_s = o.write_timeout_s;
  l.keep_alive_requests = o.keep_alive_requests;
  l.max_connections = o.max_connections;
  l.max_connections_per_address = o.max_connections_per_address;
  l.max_body = o.max_body;
  l.workers = static_cast<int>(
      o.http_workers > 0 ? o.http_workers
                         : std::min<std::int64_t>(4096, o.max_sessions + o.max_queue + 8));
  return l;
}

// Serves until SIGTERM or SIGINT (blocked in every thread, waited for here on a thread of its
// own): then stops admitting, lets requests finish within --shutdown-grace, lets the replies
// and streams write their last bytes (bounded) and stops the server.
void serve_until_signal(http::Server& svr, ServerState& state, const sigset_t& sigs) {
  std::atomic<bool> quit{false};
  std::thread signals([&] {
    const timespec tick{0, 200 * 1000 * 1000};
    while (!quit) {
      const int sig = sigtimedwait(&sigs, nullptr, &tick);
      if (sig != SIGTERM && sig != SIGINT) continue;
      std::fprintf(stderr, "veloxquant serve: signal %d: finishing requests in flight\n", sig);
      state.draining = true;
      state.sched.drain(
          std::chrono::milliseconds(static_cast<std::int64_t>(state.o.shutdown_grace_s * 1000)));
      const http::Stats& h = svr.stats();
      for (int i = 0; i < 100 && (h.exchanges_open > 0 || h.workers_busy > 0); ++i)
        std::this_thread::sleep_for(50ms);
      svr.stop();
      return;
    }
  });
  svr.run();
  quit = true;
  signals.join();
}

}  // namespace

int run_server(const ServeOptions& o) {
  // Signals go to one thread (serve_until_signal); block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal

  const CacheConfig method = CacheConfig::parse(o.method);
  engine::Model model = engine::Model::load(o.model);
  if (!o.qfilters.empty()) model.set_qfilters_path(o.qfilters);
  const auto tokenizer = engine::load_tokenizer(o.tokenizer, model);
  const engine::ModelConfig& mc = model.config();
  const TemplateKind kind =
      o.chat_template.empty()
          ? detect_template(model_chat_template(model.path(), model.directory(), mc.format))
          : parse_template_name(o.chat_template);
  const ChatTemplate chat(kind, *tokenizer, mc.bos_id, mc.eos_id, o.special);

  const SchedulerOptions so = scheduler_options(o, method, model);
  Scheduler sched(model, *tokenizer, chat, so);
  const std::int64_t need = sched.footprint(method);
  if (need > o.kv_memory) {
    throw Error(ErrorCode::kInvalidArgument,
                "--kv-memory " + std::to_string(o.kv_memory) + " holds no session of --method " +
                    method.spec() + ": one may hold " + std::to_string(need) +
                    " bytes or more at --max-context " + std::to_string(so.max_context));
  }
  ServerState state{o, method, so.max_context,
                    std::filesystem::path(model.path()).filename().string(), sched};
  state.model = &model;
  state.vocab_size = mc.vocab_size;
  std::fprintf(stderr,
               "veloxquant serve: %s (%lld layers, context %lld), template %s, method %s: a "
               "session reserves %lld bytes; --kv-memory %lld holds %lld\n",
               model.path().c_str(), static_cast<long long>(mc.n_layers),
               static_cast<long long>(so.max_context), to_string(kind), method.spec().c_str(),
               static_cast<long long>(need), static_cast<long long>(o.kv_memory),
               static_cast<long long>(o.kv_memory / need));

  http::Server::Routes routes;
  routes.dispatch = [&state](const http::Request& req, http::Headers& common,
                             http::Response& res) { return dispatch(state, req, common, res); };
  routes.work = [&state](const std::shared_ptr<http::Exchange>& ex) {
    handle_generate(state, ex->request().path == "/v1/chat/completions", ex);
  };
  routes.error_body = [](int status, const std::string& message) {
    return error_json(ServeError{status, status >= 500 ? "server_error" : "invalid_request_error",
                                 message, "", 0});
  };
  http::Server svr(http_limits(o), std::move(routes));
  state.http_server = &svr;
  const int port = svr.bind(o.host, o.port);
  std::printf("veloxquant serve: listening on http://%s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);
  serve_until_signal(svr, state, sigs);
  std::fprintf(stderr, "veloxquant serve: stopped\n");
  return 0;
}

}  // namespace vq::serve
