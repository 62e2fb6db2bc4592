// The HTTP/1.1 layer of `veloxquant serve`, on Boost.Beast (request parsing) and Boost.Asio
// (sockets, timers), Debian libboost-dev: one I/O thread runs every connection asynchronously
// (accept, read, write), so an idle or slow connection costs a socket and a buffer, never a
// thread. Requests whose handlers wait (on the scheduler) run on a bounded worker pool; their
// replies, streams included, are written back by the I/O thread.
//
// Deadlines (Limits): the request head must arrive within header_timeout_s of the accept or of
// the end of the previous response on a keep-alive connection (absolute: a byte a second does
// not extend it; missed: 408 and close), the body within body_timeout_s of the head (408 and
// close); a keep-alive connection with no byte of a next request within keep_alive_timeout_s
// is closed; each write must complete within write_timeout_s (missed: the connection is closed
// and its exchange is gone). A connection past max_connections in total or
// max_connections_per_address from one address gets 503 with Retry-After and
// Connection: close, written at once without reading its request. A head larger than
// max_header_bytes gets 431, a body larger than max_body 413, a malformed request 400; each
// then closes. Every error the layer writes itself has the JSON body `error_body` makes.
//
// Nothing here is specific to the OpenAI API: the routes are the caller's (Server::Routes).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vq::serve::http {

struct Limits {
  double header_timeout_s = 10;
  double body_timeout_s = 30;
  double keep_alive_timeout_s = 5;
  double write_timeout_s = 30;
  std::int64_t keep_alive_requests = 100;          // responses per connection, then close
  std::int64_t max_connections = 1024;             // open connections in total
  std::int64_t max_connections_per_address = 256;  // 0: no cap
  std::int64_t max_header_bytes = 16 * 1024;       // request line + headers
  std::int64_t max_body = 1 << 20;
  int workers = 8;  // the handler pool: requests handed to workers at once (then 503)
};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // as sent ("GET", "POST", ...)
  std::string target;  // as sent, query included
  std::string path;    // target up to '?'
  Headers headers;     // as sent, in order
  std::string body;
  std::string remote_addr;  // the peer's IP address, numeric
  bool http10 = false;      // an HTTP/1.0 request
  // The first header named `name` (case-insensitive), "" when there is none.
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

struct Response {
  int status = 200;
  Headers headers;  // besides Content-Type, Content-Length / Transfer-Encoding, Connection
  std::string content_type;
  std::string body;
  bool close = false;  // Connection: close after it
  // Replaces the header `name` (case-insensitive) or adds it.
  void set_header(const std::string& name, const std::string& value);
  std::string header(std::string_view name) const;
};

class Connection;

// A request handed to a worker (Server::Routes::work). Its reply goes back through the I/O
// thread: either respond() once, or begin_stream(), send_chunk()..., end_stream(), all called by
// the one worker that handles it; gone() and on_gone() may be called from any thread. A chunk is
// queued, not waited for: a client that does not take it within --write-timeout is dropped.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;
  ~Exchange();

  const Request& request() const noexcept { return req_; }
  // The client closed or reset the connection, or a write missed its deadline. Seen at once:
  // the I/O thread keeps a read outstanding on the socket while the request is handled.
  bool gone() const noexcept { return gone_.load(); }
  // `f` runs once when the client goes (on the I/O thread; at once, here, if it is gone
  // already), never after the reply has been completely written.
  void on_gone(std::function<void()> f);

  // The whole reply (the route's common headers added). Ignored once gone.
  void respond(Response r);
  // A reply in chunks (Transfer-Encoding: chunked; an HTTP/1.0 client gets the body until
  // close): `head`'s status, headers and content type, its body ignored. False once gone.
  bool begin_stream(Response head);
  bool send_chunk(std::string data);
  void end_stream();
  bool answered() const noexcept { return answered_; }

 private:
  friend class Connection;
  friend class Server;
  Exchange(Request req, Headers common, std::weak_ptr<Connection> conn)
      : req_(std::move(req)), common_(std::move(common)), conn_(std::move(conn)) {}
  void mark_gone();  // the I/O thread: the client went
  void finished();   // the I/O thread: the reply is written; on_gone is dropped

  Request req_;
  Headers common_;
  std::weak_ptr<Connection> conn_;
  std::atomic<bool> gone_{false};
  std::function<void(std::function<void()>)> post_;  // runs a function on the I/O thread
  // Touched by the one worker that handles the exchange only:
  bool answered_ = false;  // respond() or begin_stream() called
  bool streaming_ = false, ended_ = false;
  std::mutex m_;  // guards on_gone_ and done_
  std::function<void()> on_gone_;
  bool done_ = false;  // the reply is written (on_gone_ dropped)
};

// What the layer has seen (for /metrics); read from any thread.
struct Stats {
  std::atomic<std::int64_t> connections_open{0}, connections_total{0};
  std::atomic<std::int64_t> rejected_total{0};        // 503 at accept (a connection cap)
  std::atomic<std::int64_t> rejected_per_address{0};  // of which by the per-address cap
  std::atomic<std::int64_t> header_timeouts{0}, body_timeouts{0}, write_timeouts{0};
  std::atomic<std::int64_t> keep_alive_closed{0};  // idle past keep_alive_timeout_s
  std::atomic<std::int64_t> keep_alive_limit{0};   // closed after keep_alive_requests
  std::atomic<std::int64_t> bad_requests{0};       // 400, 413, 431 written by the layer
  std::atomic<std::int64_t> workers_busy{0};       // requests on the worker pool now
  std::atomic<std::int64_t> workers_refused{0};    // 503: every worker busy
  std::atomic<std::int64_t> exchanges_open{0};     // handed to workers, reply not yet written
};

class Server {
 public:
  struct Routes {
    // On the I/O thread, for each complete request: fills `common` with the headers every
    // reply to it carries (CORS) and either answers it in `res` (true) or leaves it to `work`
    // (false). Must not block.
    std::function<bool(const Request&, Headers& common, Response& res)> dispatch;
    // On a worker, for a request dispatch left: answers through the exchange (a reply it
    // leaves unanswered becomes 500; an exception too, its text on stderr only).
    std::function<void(const std::shared_ptr<Exchange>&)> work;
    // The JSON body of an error the layer writes itself (status, message).
    std::function<std::string(int, const std::string&)> error_body;
  };

  Server(Limits limits, Routes routes);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (0: any free port) with SO_REUSEADDR only (never SO_REUSEPORT), so an
  // address in use is an Error here, naming it; returns the port bound.
  int bind(const std::string& host, int port);
  // Runs the I/O thread's loop until stop() (returns then, the workers joined).
  void run();
  // Thread-safe: stops accepting, closes every connection (their exchanges become gone) and
  // makes run() return.
  void stop();
  const Stats& stats() const noexcept { return stats_; }
  const Limits& limits() const noexcept { return limits_; }

 private:
  friend class Connection;
  struct Impl;
  Limits limits_;
  Routes routes_;
  Stats stats_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vq::serve::http
