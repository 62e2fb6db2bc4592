#include "serve/server.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
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
#include "serve/openai.h"
#include "serve/peer.h"
#include "veloxquant/errors.h"

namespace vq::serve {

namespace {
using json = nlohmann::json;
using namespace std::chrono_literals;

void send_error(httplib::Response& res, const ServeError& e) {
  res.status = e.status;
  if (e.retry_after > 0) res.set_header("Retry-After", std::to_string(e.retry_after));
  res.set_content(error_json(e), "application/json");
}

const char* reason_of(int status) {
  switch (status) {
    case 400: return "bad request";
    case 401: return "missing or wrong API key";
    case 404: return "no such endpoint";
    case 405: return "method not allowed on this endpoint";
    case 413: return "the request body is larger than --max-body";
    case 415: return "unsupported request body type (send JSON)";
    case 414: return "the request URI is too long";
    default: return "request failed";
  }
}

std::int64_t process_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

std::string metrics_text(const Metrics& m) {
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
  int sock = -1;  // the connection's socket (peer_gone), -1 when it was not found
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
  std::atomic<int> inflight{0};  // streams still writing
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
std::string cors_origin(const ServeOptions& o, const httplib::Request& req) {
  if (o.cors_origins.empty() || !req.has_header("Origin")) return "";
  const std::string origin = req.get_header_value("Origin");
  for (const auto& allowed : o.cors_origins) {
    if (allowed == "*") return "*";
    if (allowed == origin) return origin;
  }
  return "";
}

// The listening socket gets SO_REUSEADDR only: cpp-httplib's default also sets SO_REUSEPORT,
// which let a second server bind the same port and silently take half the connections.
void listen_socket_options(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
}

// Thread pool, size and time limits, JSON error bodies, CORS (opt-in), 405 for a known path's
// wrong method, and the API key check on /v1/.
void configure_http(httplib::Server& svr, const ServeOptions& o) {
  const int pool = o.http_threads > 0
                       ? o.http_threads
                       : static_cast<int>(std::min<std::int64_t>(256, 2 * o.max_sessions + 8));
  svr.new_task_queue = [pool] { return new httplib::ThreadPool(static_cast<size_t>(pool)); };
  svr.set_socket_options(listen_socket_options);
  svr.set_payload_max_length(static_cast<size_t>(o.max_body));
  svr.set_read_timeout(5, 0);
  svr.set_write_timeout(5, 0);
  svr.set_keep_alive_timeout(5);
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) {
      res.set_content(error_json(ServeError{res.status,
                                            res.status >= 500 ? "server_error"
                                                              : "invalid_request_error",
                                            reason_of(res.status), "", 0}),
                      "application/json");
    }
  });
  // A handler that throws: 500 with a fixed message (cpp-httplib's default would copy the
  // exception's text into an EXCEPTION_WHAT header); the text goes to stderr only.
  svr.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        std::fprintf(stderr, "veloxquant serve: %s %s failed: %s\n", req.method.c_str(),
                     req.path.c_str(), what.c_str());
        send_error(res,
                   ServeError{500, "server_error", "internal error (logged by the server)", "", 0});
      });
  svr.set_pre_routing_handler([&o](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = cors_origin(o, req);
    if (!origin.empty()) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Access-Control-Expose-Headers", "Retry-After");
    }
    if (!o.cors_origins.empty()) res.set_header("Vary", "Origin");
    const char* allow = allowed_methods(req.path);
    if (allow != nullptr && req.method == "OPTIONS") {
      // A CORS preflight (or a plain OPTIONS): answered before the key check, which a
      // preflight cannot pass (browsers send it without the Authorization header).
      res.status = 204;
      res.set_header("Allow", allow);
      if (!origin.empty()) {
        res.set_header("Access-Control-Allow-Methods", allow);
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers",
                       asked.empty() ? std::string("Authorization, Content-Type") : asked);
        res.set_header("Access-Control-Max-Age", "600");
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    if (allow != nullptr && !method_allowed(req.method, allow)) {
      send_error(res, ServeError{405, "invalid_request_error",
                                 req.method.substr(0, 16) + " is not allowed on " + req.path +
                                     " (allowed: " + allow + ")",
                                 "", 0});
      res.set_header("Allow", allow);
      if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding"))
        res.set_header("Connection", "close");  // its body is left unread
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!o.api_key.empty() && req.path.rfind("/v1/", 0) == 0 &&
        req.get_header_value("Authorization") != "Bearer " + o.api_key) {
      send_error(res, ServeError{401, "invalid_request_error",
                                 "missing or wrong API key (send Authorization: Bearer KEY)", "", 0});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
}

// Answers a streamed request with server-sent events: each choice's text as it comes (chunks
// with its index, its tokens' log probabilities when asked), then its last chunk with
// finish_reason, then (stream_options.include_usage) a chunk with no choices and the usage,
// then [DONE]. Without include_usage a choice's last chunk carries the usage of that choice
// (an extension, as before). An error ends the stream with an error event and [DONE] (the
// other choices are cancelled). A client gone cancels the jobs.
void stream_reply(httplib::Response& res, std::shared_ptr<StreamState> st,
                  std::atomic<int>& inflight) {
  ++inflight;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& data) {
          const std::string line =
              "data: " + (data.is_string() ? data.get<std::string>() : dump(data)) + "\n\n";
          return sink.write(line.data(), line.size());
        };
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
            json chunk =
                chunk_json(st->id, st->chat, st->model, st->created, static_cast<int>(i), text,
                           st->logprobs && !lps.empty() ? &lps : nullptr, nullptr, s, c.first);
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
          ok = send(json(error_json(*error))) && send(json("[DONE]"));
          if (ok) sink.done();
        } else if (ok && all_done) {
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
          ok = ok && send(json("[DONE]"));
          if (ok) sink.done();
        } else if (ok && !news) {
          // Nothing to write: a client gone is seen here, not only at the next failed write.
          if (peer_gone(st->sock))
            ok = false;
          else
            st->wake->wait(seen, 100ms);
        }
        if (!ok) {
          st->cancel_all();
          return false;
        }
        return true;
      },
      [st, &inflight](bool success) {
        if (!success) st->cancel_all();
        --inflight;
      });
}

// Reads a POST body into `body` with --max-body as its only limit, whatever the Content-Type.
// (cpp-httplib's own reading caps application/x-www-form-urlencoded bodies, curl's default type,
// at 8 KiB and parses them as a form; a handler with a content reader bypasses both.) A
// multipart body is drained and refused with 415: the API takes JSON. False: `res` holds the
// error.
bool read_body(const httplib::Request& req, httplib::Response& res,
               const httplib::ContentReader& reader, std::int64_t max_body, std::string& body) {
  if (req.is_multipart_form_data()) {
    reader([](const httplib::MultipartFormData&) { return true; },
           [](const char*, size_t) { return true; });
    send_error(res, ServeError{415, "invalid_request_error",
                               "multipart/form-data bodies are not accepted; send the request as "
                               "JSON (Content-Type: application/json)",
                               "", 0});
    return false;
  }
  bool too_big = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (body.size() + n > static_cast<std::size_t>(max_body)) {
      too_big = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (too_big || res.status == 413) {
    send_error(res, ServeError{413, "invalid_request_error",
                               "the request body is larger than --max-body (" +
                                   std::to_string(max_body) + " bytes)",
                               "", 0});
    res.set_header("Connection", "close");  // the rest of a chunked body is left unread
    return false;
  }
  if (!ok) {
    send_error(res, ServeError{400, "invalid_request_error", "the request body could not be read",
                               "", 0});
    res.set_header("Connection", "close");
    return false;
  }
  return true;
}

// POST /v1/chat/completions (chat_endpoint) or /v1/completions: read and parse the body, queue,
// wait for admission and, for a stream, its first token (errors keep their status: a model whose
// first output is not finite answers 500, not a 200 stream holding an error), then the whole
// reply or a stream.
void handle_generate(ServerState& state, bool chat_endpoint, const httplib::Request& req,
                     httplib::Response& res, const httplib::ContentReader& reader) {
  std::string body;
  if (!read_body(req, res, reader, state.o.max_body, body)) return;
  if (state.draining) {
    send_error(res, ServeError{503, "server_error", "the server is shutting down", "", 1});
    return;
  }
  // A model file truncated under its mapping would kill the process (SIGBUS): refused instead.
  if (const std::string changed = state.model ? state.model->file_change() : ""; !changed.empty()) {
    send_error(res, ServeError{503, "server_error", changed + "; restart the server", "", 0});
    return;
  }
  ParsedRequest p;
  try {
    p = parse_request(body, chat_endpoint, state.method, state.max_context, state.vocab_size);
  } catch (const ServeError& e) {
    send_error(res, e);
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
      send_error(res, e);
      return;
    } catch (const Error& e) {
      cancel_all();
      send_error(res, ServeError{400, "invalid_request_error", e.what(), "veloxquant.method", 0});
      return;
    }
    jobs.push_back(std::move(job));
  }
  // A client that goes away while the request waits (queued, generating a non-streamed reply,
  // or before a stream's first token) cancels its jobs: the scheduler drops them from the queue
  // or ends them after the current step and frees their sessions.
  const int sock =
      connection_socket(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  auto client_gone = [&] {
    if (!peer_gone(sock)) return false;
    cancel_all();
    // Nobody reads this answer; it is what a log of the request shows.
    send_error(res, ServeError{499, "invalid_request_error", "the client disconnected", "", 0});
    res.set_header("Connection", "close");
    return true;
  };
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
    if (client_gone()) return;
  }
  if (snap[0].error) {
    cancel_all();
    send_error(res, *snap[0].error);
    return;
  }
  const std::int64_t created = static_cast<std::int64_t>(std::time(nullptr));
  const std::string id = (chat_endpoint ? "chatcmpl-" : "cmpl-") + std::to_string(state.next_id++);
  if (!p.stream) {
    std::vector<ChoiceOutput> out(jobs.size());
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      while (!snap[i].done) {
        take(i, 100ms);
        if (!snap[i].done && client_gone()) return;
      }
      if (snap[i].error) {
        cancel_all();
        send_error(res, *snap[i].error);
        return;
      }
      out[i] = ChoiceOutput{std::move(carry[i]), std::move(carry_lp[i]), snap[i]};
    }
    res.set_content(
        dump(completion_json(id, chat_endpoint, state.model_name, created, out, p.gen.logprobs)),
        "application/json");
    return;
  }
  auto st = std::make_shared<StreamState>();
  st->wake = wake;
  st->id = id;
  st->model = state.model_name;
  st->created = created;
  st->chat = chat_endpoint;
  st->include_usage = p.include_usage;
  st->logprobs = p.gen.logprobs;
  st->sock = sock;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    StreamChoice c;
    c.job = jobs[i];
    c.carry = std::move(carry[i]);
    c.carry_lp = std::move(carry_lp[i]);
    st->choices.push_back(std::move(c));
  }
  stream_reply(res, std::move(st), state.inflight);
}

// The endpoints: the two generation ones, /v1/models, /health, /metrics and the chat page.
void add_routes(httplib::Server& svr, ServerState& state) {
  svr.Post("/v1/chat/completions", [&state](const httplib::Request& req, httplib::Response& res,
                                             const httplib::ContentReader& reader) {
    handle_generate(state, true, req, res, reader);
  });
  svr.Post("/v1/completions", [&state](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& reader) {
    handle_generate(state, false, req, res, reader);
  });
  svr.Get("/v1/models", [&state](const httplib::Request&, httplib::Response& res) {
    json j = {{"object", "list"},
              {"data", json::array({{{"id", state.model_name},
                                     {"object", "model"},
                                     {"created", 0},
                                     {"owned_by", "veloxquant"}}})}};
    res.set_content(dump(j), "application/json");
  });
  svr.Get("/health", [&state](const httplib::Request&, httplib::Response& res) {
    if (state.draining) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
  });
  svr.Get("/metrics", [&state](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(state.sched.metrics()), "text/plain; version=0.0.4");
  });
  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(chat_page_html(), "text/html; charset=utf-8");
  });
}

// Binds --host:--port (0: any free port) and returns the port.
int bind_port(httplib::Server& svr, const ServeOptions& o) {
  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    if (port < 0) throw Error(ErrorCode::kIoError, "cannot bind to " + o.host + " (any port)");
  } else {
    errno = 0;
    if (!svr.bind_to_port(o.host, port)) {
      const int err = errno;
      throw Error(ErrorCode::kIoError,
                  "cannot bind to " + o.host + ":" + std::to_string(port) +
                      (err == EADDRINUSE
                           ? ": the address is already in use (another server listens there)"
                           : " (in use, or not an address of this machine" +
                                 (err != 0 ? std::string(": ") + std::strerror(err) : "") + ")"));
    }
  }
  return port;
}

// Serves until SIGTERM or SIGINT (blocked in every thread, waited for here on a thread of its
// own): then stops admitting, lets requests finish within --shutdown-grace, lets the streams
// write their last events (bounded) and stops the server. True when listening ended cleanly.
bool serve_until_signal(httplib::Server& svr, ServerState& state, const sigset_t& sigs) {
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
      for (int i = 0; i < 100 && state.inflight > 0; ++i) std::this_thread::sleep_for(50ms);
      svr.stop();
      return;
    }
  });
  const bool ok = svr.listen_after_bind();
  quit = true;
  signals.join();
  return ok;
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

  httplib::Server svr;
  configure_http(svr, o);
  add_routes(svr, state);
  const int port = bind_port(svr, o);
  std::printf("veloxquant serve: listening on http://%s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);
  const bool ok = serve_until_signal(svr, state, sigs);
  std::fprintf(stderr, "veloxquant serve: stopped\n");
  return ok ? 0 : 1;
}

}  // namespace vq::serve
