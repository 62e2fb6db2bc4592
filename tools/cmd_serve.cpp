// `veloxquant serve`: an OpenAI-compatible server holding many conversations in a fixed K/V
// memory budget, with continuous batching (src/serve/, docs/serve.md).
#include <memory>

#include "cli.h"
#include "engine/run/resources.h"
#include "serve/server.h"
#include "veloxquant/errors.h"

namespace vq::cli {

namespace {

// The model, its tokenizer and the default method.
void add_model_options(CLI::App& cmd, serve::ServeOptions& o) {
  cmd.add_option("--model", o.model, "Checkpoint: llama2.c .bin, Hugging Face directory, GGUF")
      ->required()
      ->check(non_empty_path());
  cmd.add_option("--tokenizer", o.tokenizer, "Tokenizer (default: next to the model)")
      ->check(non_empty_path());
  cmd.add_option("--qfilters", o.qfilters,
                 "Key-filter file of method qfilters (default: <model>.qfilters, made by "
                 "`veloxquant calibrate`)")
      ->check(non_empty_path());
  cmd.add_option("--method", o.method,
                 "Default KV-cache method spec (a request may choose another with "
                 "\"veloxquant\": {\"method\": SPEC})")
      ->capture_default_str();
}

// What the scheduler may hold and do: K/V memory, sessions, step sizes, queue, limits.
void add_scheduler_options(CLI::App& cmd, serve::ServeOptions& o) {
  cmd.add_option_function<std::string>(
         "--kv-memory",
         [&o](const std::string& text) {
           const std::uint64_t b = engine::parse_memory_size(text, "--kv-memory");
           if (b > static_cast<std::uint64_t>(INT64_MAX))
             throw vq::Error(vq::ErrorCode::kInvalidArgument, "--kv-memory is too large: " + text);
           o.kv_memory = static_cast<std::int64_t>(b);
         },
         "K/V cache bytes all sessions may hold together (e.g. 512M, 4G; default 1G)")
      ->type_name("BYTES");
  cmd.add_option("--max-sessions", o.max_sessions, "Most live sessions (active + idle)")
      ->capture_default_str()
      ->check(int_range(1, 100000));
  cmd.add_option("--max-context", o.max_context,
                 "Most positions a session holds (default: min(4096, the model's context))")
      ->check(int_range(2, std::int64_t{1} << 20));
  cmd.add_option("--prefill-chunk", o.chunk, "Prompt tokens per session per step")
      ->capture_default_str()
      ->check(int_range(1, 4096));
  cmd.add_option("--step-tokens", o.step_tokens, "Most tokens in one batched step")
      ->capture_default_str()
      ->check(int_range(1, 65536));
  cmd.add_option("--max-queue", o.max_queue, "Requests that may wait for memory (then 503)")
      ->capture_default_str()
      ->check(int_range(0, 100000));
  cmd.add_option("--queue-timeout", o.queue_timeout_s, "Seconds a request may wait (then 503)")
      ->capture_default_str()
      ->check(real_range(0, 86400));
  cmd.add_option("--max-body", o.max_body,
                 "Largest request body in bytes, whatever its Content-Type (then 413)")
      ->capture_default_str()
      ->check(int_range(64, std::int64_t{1} << 30));
  cmd.add_option("--client-methods", o.client_methods,
                 "Method specs one client (by address) may have measured at a time; its least "
                 "recently used is dropped for a new one")
      ->capture_default_str()
      ->check(int_range(1, 100000));
  cmd.add_option("--methods-allowed", o.methods_allowed,
                 "The only method specs a request may name besides --method, separated by ';' "
                 "(e.g. 'h2o:budget=512;kivi:bits=2'); all measured at startup; others get 400 "
                 "(default: any spec, measured on first use off the request path)");
  add_head_pattern_option(cmd, o.head_pattern);
  cmd.add_option("--max-method-specs", o.max_method_specs,
                 "Distinct method specs known at once (--method and --methods-allowed count); "
                 "a new spec past it drops the least recently used measured one, or gets 429 "
                 "when none can be dropped")
      ->capture_default_str()
      ->check(int_range(1, 100000));
  auto* session_dir = cmd.add_option("--session-dir", o.session_dir,
                 "Write every chat turn's session (conversation + compressed cache) to DIR, so "
                 "a session dropped for room, or held by a server that restarted or died, is "
                 "restored when its conversation goes on, and an edited reply resumes from the "
                 "turn before (default: sessions live in memory only)")
      ->check(non_empty_path())
      ->type_name("DIR");
  cmd.add_option_function<std::string>(
         "--session-dir-bytes",
         [&o](const std::string& text) {
           const std::uint64_t b = engine::parse_memory_size(text, "--session-dir-bytes");
           if (b == 0 || b > static_cast<std::uint64_t>(INT64_MAX)) {
             throw vq::Error(vq::ErrorCode::kInvalidArgument,
                             "--session-dir-bytes must be positive and below 8 EiB, got " + text);
           }
           o.session_dir_bytes = static_cast<std::int64_t>(b);
         },
         "Most bytes of session files in --session-dir; the oldest are removed past it "
         "(e.g. 512M, 20G; default 4G)")
      ->type_name("BYTES")
      ->needs(session_dir);
  cmd.add_option("--shutdown-grace", o.shutdown_grace_s,
                 "Seconds requests in flight may run after SIGTERM")
      ->capture_default_str()
      ->check(real_range(0, 3600));
}

// The HTTP layer's deadlines, caps and handler pool (src/serve/http.h). --http-threads (a
// thread per connection, before issue 32) is refused with what replaced it, not ignored.
void add_connection_options(CLI::App& cmd, serve::ServeOptions& o) {
  cmd.add_option("--header-timeout", o.header_timeout_s,
                 "Seconds a request head may take to arrive, counted from the accept or the end "
                 "of the previous response (then 408 and close)")
      ->capture_default_str()
      ->check(real_range(0.1, 3600));
  cmd.add_option("--body-timeout", o.body_timeout_s,
                 "Seconds a request body may take to arrive after its head (then 408 and close)")
      ->capture_default_str()
      ->check(real_range(0.1, 3600));
  cmd.add_option("--keep-alive-timeout", o.keep_alive_timeout_s,
                 "Seconds a keep-alive connection may stay idle between requests (then closed)")
      ->capture_default_str()
      ->check(real_range(0.1, 3600));
  cmd.add_option("--keep-alive-requests", o.keep_alive_requests,
                 "Responses per connection (the last says Connection: close)")
      ->capture_default_str()
      ->check(int_range(1, 1000000));
  cmd.add_option("--write-timeout", o.write_timeout_s,
                 "Seconds one write to a client may take (a client that stops reading is "
                 "dropped and its request cancelled)")
      ->capture_default_str()
      ->check(real_range(0.1, 3600));
  cmd.add_option("--max-connections", o.max_connections,
                 "Open connections in total; past it a new one gets 503 and is closed")
      ->capture_default_str()
      ->check(int_range(1, 1000000));
  cmd.add_option("--max-connections-per-address", o.max_connections_per_address,
                 "Open connections from one client address (0: no cap); past it 503 and close")
      ->capture_default_str()
      ->check(int_range(0, 1000000));
  cmd.add_option("--http-workers", o.http_workers,
                 "Threads that run generation requests (queued, generating, streaming) at once; "
                 "past it 503 (default: max-sessions + max-queue + 8, at most 4096)")
      ->check(int_range(1, 4096));
  cmd.add_option_function<std::string>(
         "--http-threads",
         [](const std::string&) {
           throw vq::Error(vq::ErrorCode::kInvalidArgument,
                           "--http-threads is gone: connections no longer take a thread each (one "
                           "event loop serves them all); use --http-workers N for the threads that "
                           "run generation requests");
         },
         "Removed: see --http-workers")
      ->group("");
}

// The chat template and the HTTP side: address, port, key.
void add_http_options(CLI::App& cmd, serve::ServeOptions& o) {
  cmd.add_option("--chat-template", o.chat_template,
                 "plain|llama2|mistral|llama3|chatml (default: recognised from the model)");
  cmd.add_flag("--special", o.special,
               "Parse special-token text (<|im_end|>, </s>, ...) typed in message content as "
               "those tokens (default: content is plain text)");
  cmd.add_option("--host", o.host, "Address to listen on")->capture_default_str();
  cmd.add_option("--port", o.port, "Port (0: any free port, printed)")
      ->capture_default_str()
      ->check(int_range(0, 65535));
  cmd.add_option("--api-key", o.api_key, "Require Authorization: Bearer KEY on /v1/");
  cmd.add_option("--cors-origin", o.cors_origins,
                 "Allow browser pages from ORIGIN (e.g. https://app.example; repeatable; * = any) "
                 "to call the API: CORS headers and preflights (default: no CORS)")
      ->type_name("ORIGIN")
      ->allow_extra_args(false);
  add_connection_options(cmd, o);
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<serve::ServeOptions>();
  auto threads = std::make_shared<int>(0);
  auto* cmd = app.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /metrics, a chat page "
      "at /): sessions keep their compressed caches, admitted only while their footprints fit "
      "--kv-memory, decoded together in batched steps");
  add_model_options(*cmd, *o);
  add_scheduler_options(*cmd, *o);
  add_http_options(*cmd, *o);
  add_threads_option(cmd, *threads);
  add_q8_activations_option(cmd);
  cmd->callback([o, threads]() {
    apply_threads(*threads);
    set_activity("serving '" + o->model + "'");
    const int rc = serve::run_server(*o);
    if (rc != 0) throw vq::Error(vq::ErrorCode::kIoError, "the HTTP listener failed");
  });
}

}  // namespace vq::cli
