// `veloxquant serve`: an OpenAI-compatible HTTP server over the scheduler (serve/scheduler.h),
// on an event-driven HTTP layer (serve/http.h: Boost.Beast + Boost.Asio, one I/O thread for
// every connection, the generation handlers on a bounded worker pool).
//
//   POST /v1/chat/completions, POST /v1/completions   (stream: true -> server-sent events
//                                                     ending in "data: [DONE]")
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text), GET / (the chat page)
//
// Errors are OpenAI's {"error": {...}} with the HTTP status (400 invalid request, 401 missing
// or wrong API key, 404, 405 (with Allow) for a known path's wrong method, 408 a request head or
// body past its deadline, 413 body over --max-body, 415 multipart body, 431 a head over 16 KiB,
// 503 + Retry-After when no memory comes free, past a connection cap, or while shutting down,
// 500 on an engine failure, with no exception text in any header). OPTIONS on a known path
// answers 204 with Allow; with --cors-origin, responses to a listed Origin carry
// Access-Control-Allow-Origin and preflights the allowed methods and headers (no CORS
// otherwise). The listening socket sets SO_REUSEADDR only, so a port in use is a startup
// error. SIGTERM or SIGINT: stop admitting (new requests 503), let requests in flight finish
// within --shutdown-grace (the rest then fail with 503: a stream gets an error event and
// [DONE]), close the listener and return.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serve/scheduler.h"

namespace vq::serve {

struct ServeOptions {
  std::string model, tokenizer, method = "full", chat_template;  // "" = from the model
  std::string qfilters;  // qfilters' key-filter file ("" = <model>.qfilters)
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (the one chosen is printed)
  std::string api_key;
  std::vector<std::string> cors_origins;  // --cors-origin (repeatable; "*" = any); none: no CORS
  std::int64_t kv_memory = std::int64_t{1} << 30;
  std::int64_t max_sessions = 64;
  std::int64_t max_context = 0;  // 0: min(4096, the model's seq_len)
  std::int64_t chunk = 32;
  std::int64_t step_tokens = 256;
  std::int64_t max_queue = 64;
  double queue_timeout_s = 30.0;
  std::int64_t max_body = 1 << 20;  // the only body limit, whatever the Content-Type
  std::int64_t client_methods = 4;  // method specs one client may have measured (LRU beyond)
  // --methods-allowed "SPEC;SPEC...": the only specs served besides --method (all measured at
  // startup); "" = any spec. ';' separates: specs use ',' and ':' but never ';'.
  std::string methods_allowed;
  std::int64_t max_method_specs = 32;  // --max-method-specs: distinct specs known at once
  bool special = false;  // --special: special-token text in message content becomes tokens
  double shutdown_grace_s = 10.0;
  // The HTTP layer (serve/http.h): deadlines in seconds, connection caps, the handler pool.
  double header_timeout_s = 10, body_timeout_s = 30, keep_alive_timeout_s = 5;
  double write_timeout_s = 30;
  std::int64_t keep_alive_requests = 100;
  std::int64_t max_connections = 1024;
  std::int64_t max_connections_per_address = 256;  // 0: no cap
  std::int64_t http_workers = 0;  // 0: max_sessions + max_queue + 8 (at most 4096)
  std::string head_pattern;  // --duo-pattern FILE (methods with head types); "" = none
  std::string session_dir;   // --session-dir DIR: sessions written at each turn; "" = none
  std::int64_t session_dir_bytes = std::int64_t{4} << 30;  // --session-dir-bytes
};

// Loads the model, serves until SIGTERM/SIGINT, returns the process exit code. Prints
// "veloxquant serve: listening on http://HOST:PORT" to stdout once the socket is bound.
int run_server(const ServeOptions& options);

// The chat page (plain HTML and JavaScript, no framework).
const char* chat_page_html() noexcept;

}  // namespace vq::serve
