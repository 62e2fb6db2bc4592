#include "serve/http.h"

#include <strings.h>
#include <sys/resource.h>

// Boost 1.74's Beast parser trips GCC 12's -Wmaybe-uninitialized (on a boost::optional inside
// basic_parser) when built with -fsanitize=address: a false positive in the library.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#pragma GCC diagnostic pop
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>

#include "veloxquant/errors.h"

namespace vq::serve::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string reason_phrase(int status) {
  const auto r = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  if (r.empty() || r.front() == '<') return "Unknown";
  return std::string(r.data(), r.size());
}

// The status line and headers of `r`; `length` < 0: no Content-Length (a chunked or
// close-delimited body, or a status that has no body).
std::string serialize_head(const Response& r, bool chunked, std::int64_t length, bool close,
                           bool http10) {
  std::string s = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  for (const auto& [k, v] : r.headers) s += k + ": " + v + "\r\n";
  if (!r.content_type.empty()) s += "Content-Type: " + r.content_type + "\r\n";
  if (chunked) {
    s += "Transfer-Encoding: chunked\r\n";
  } else if (length >= 0) {
    s += "Content-Length: " + std::to_string(length) + "\r\n";
  }
  if (close) {
    s += "Connection: close\r\n";
  } else if (http10) {
    s += "Connection: keep-alive\r\n";
  }
  return s + "\r\n";
}

bool has_body(int status) { return status >= 200 && status != 204 && status != 304; }

// The worker threads: started on demand, up to `max` running handlers at once.
class WorkerPool {
 public:
  explicit WorkerPool(int max) : max_(max) {}
  ~WorkerPool() { join(); }
  // Runs `task` on a worker; false (and nothing runs) when `max` tasks run already.
  bool try_run(std::function<void()> task) {
    std::lock_guard lock(m_);
    if (stopping_ || busy_ >= max_) return false;
    ++busy_;
    tasks_.push_back(std::move(task));
    if (idle_ > 0) {
      --idle_;
      cv_.notify_one();
    } else {
      threads_.emplace_back([this] { loop(); });
    }
    return true;
  }
  // Lets the running tasks finish and joins the threads.
  void join() {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      task = nullptr;
      lock.lock();
      --busy_;
      ++idle_;
    }
  }
  const int max_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int busy_ = 0, idle_ = 0;
  bool stopping_ = false;
};

}  // namespace

// ---- Request, Response ------------------------------------------------------------------------

std::string Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

bool Request::has_header(std::string_view name) const {
  for (const auto& kv : headers)
    if (iequals(kv.first, name)) return true;
  return false;
}

void Response::set_header(const std::string& name, const std::string& value) {
  for (auto& [k, v] : headers) {
    if (iequals(k, name)) {
      v = value;
      return;
    }
  }
  headers.emplace_back(name, value);
}

std::string Response::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

// ---- The server's shared state ----------------------------------------------------------------

struct Server::Impl {
  explicit Impl(int workers) : pool(workers) {}
  void accept(Server& srv);
  void on_accept(Server& srv, tcp::socket s);
  static void work(Server& srv, const std::shared_ptr<Exchange>& ex);
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  net::steady_timer accept_retry{io};
  WorkerPool pool;
  // The I/O thread only:
  std::map<std::string, std::int64_t> per_address;  // open connections by peer address
  std::map<Connection*, std::weak_ptr<Connection>> conns;
  bool stopped = false;
};

// ---- One connection (the I/O thread only) -----------------------------------------------------

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server& srv, tcp::socket socket, std::string addr, bool counted)
      : srv_(srv),
        impl_(*srv.impl_),
        socket_(std::move(socket)),
        read_timer_(impl_.io),
        write_timer_(impl_.io),
        addr_(std::move(addr)),
        counted_(counted) {}

  ~Connection() {
    impl_.conns.erase(this);
    if (counted_) {
      --srv_.stats_.connections_open;
      auto it = impl_.per_address.find(addr_);
      if (it != impl_.per_address.end() && --it->second <= 0) impl_.per_address.erase(it);
    }
  }

  void start() {
    impl_.conns.emplace(this, weak_from_this());
    begin_request(Clock::now(), false);
  }

  // Past a connection cap: `res` (503, Connection: close) at once, without reading the request.
  void reject(Response res) {
    impl_.conns.emplace(this, weak_from_this());
    phase_ = Phase::kClosing;
    linger_ = std::chrono::milliseconds(500);
    write_response(std::move(res), true);
  }

  // Closes at once: the socket, the timers, and the exchange (gone, its callback run).
  void close() {
    if (phase_ == Phase::kClosed) return;
    auto keep = shared_from_this();
    phase_ = Phase::kClosed;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    read_timer_.cancel();
    write_timer_.cancel();
    end_exchange(true);
  }

  // From the exchange's worker, posted to the I/O thread.
  void exchange_respond(const Exchange* ex, Response r) {
    if (!current(ex)) return;
    add_common(r);
    const bool close = r.close;
    write_response(std::move(r), close);
  }
  void exchange_begin(const Exchange* ex, Response head) {
    if (!current(ex)) return;
    add_common(head);
    chunked_ = !http10_;
    if (http10_) close_after_ = true;  // the body ends with the connection
    bool close = decide_close(head.close);
    enqueue(serialize_head(head, chunked_, -1, close, http10_));
  }
  void exchange_chunk(const Exchange* ex, std::string data) {
    if (!current(ex) || data.empty()) return;
    if (!chunked_) {
      enqueue(std::move(data));
      return;
    }
    char size[20];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    enqueue(size + data + "\r\n");
  }
  void exchange_end(const Exchange* ex) {
    if (!current(ex)) return;
    complete_ = true;
    enqueue(chunked_ ? std::string("0\r\n\r\n") : std::string());
  }

 private:
  enum class Phase {
    kHead,     // reading a request head
    kBody,     // reading its body
    kBusy,     // handling it and writing the reply (bytes read are kept: a next request)
    kClosing,  // writing a last reply (bytes read are dropped), then lingering
    kLinger,   // the reply written and our side shut: dropping what the peer still sends
    kClosed,
  };
  enum class Deadline { kNone, kIdle, kHead, kBody, kLinger };

  const Limits& limits() const { return srv_.limits_; }

  bool current(const Exchange* ex) const {
    return phase_ != Phase::kClosed && exchange_ && exchange_.get() == ex;
  }

  void add_common(Response& r) const {
    for (const auto& [k, v] : exchange_->common_)
      if (r.header(k).empty()) r.headers.emplace_back(k, v);
  }

  // Whether the connection closes after this reply: asked by the reply or the client, or the
  // keep-alive cap reached.
  bool decide_close(bool asked) {
    if (!asked && keep_alive_ && responses_ + 1 >= limits().keep_alive_requests) {
      ++srv_.stats_.keep_alive_limit;
      asked = true;
    }
    if (asked || !keep_alive_) close_after_ = true;
    return close_after_;
  }

  // ---- reading ----

  // Ready for a request: the head is due within --header-timeout of `from` (the accept or the
  // end of the previous reply); on a keep-alive connection with nothing buffered, the first byte
  // is due within --keep-alive-timeout.
  void begin_request(Clock::time_point from, bool keep_alive_wait) {
    phase_ = Phase::kHead;
    head_request_ = http10_ = false;  // until this request's head says otherwise
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(limits().max_header_bytes));
    parser_->body_limit(static_cast<std::uint64_t>(limits().max_body));
    parser_->eager(true);
    head_deadline_ = from + seconds(limits().header_timeout_s);
    if (keep_alive_wait && buffer_.size() == 0) {
      arm(Deadline::kIdle, std::min(head_deadline_, from + seconds(limits().keep_alive_timeout_s)));
    } else {
      arm(Deadline::kHead, head_deadline_);
    }
    parse();
  }

  void read() {
    if (reading_ || phase_ == Phase::kClosed) return;
    reading_ = true;
    auto self = shared_from_this();
    // Into a buffer of its own: buffer_ may be parsed and consumed while this read is pending.
    socket_.async_read_some(net::buffer(rbuf_), [self](const boost::system::error_code& ec,
                                                       std::size_t n) { self->on_read(ec, n); });
  }

  void on_read(const boost::system::error_code& ec, std::size_t n) {
    reading_ = false;
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      // End of file or a reset. While a reply is still to be written for a request being
      // handled, the client is gone; a last reply (kClosing) is still written.
      if (phase_ == Phase::kClosing) {
        peer_closed_ = true;
      } else {
        close();
      }
      return;
    }
    if (phase_ == Phase::kClosing || phase_ == Phase::kLinger) {
      dropped_ += static_cast<std::int64_t>(n);
      if (dropped_ > (std::int64_t{1} << 20) && phase_ == Phase::kLinger) {
        close();
        return;
      }
      read();
      return;
    }
    std::memcpy(buffer_.prepare(n).data(), rbuf_.data(), n);
    buffer_.commit(n);
    switch (phase_) {
      case Phase::kHead:
      case Phase::kBody:
        if (deadline_ == Deadline::kIdle) arm(Deadline::kHead, head_deadline_);
        parse();
        return;
      case Phase::kBusy:
        // A next request (pipelined) is kept for later; past 64 KiB the connection is no longer
        // read until the reply is written (a closed peer is then seen by the writes only).
        if (buffer_.size() < 65536) read();
        return;
      case Phase::kClosing:
      case Phase::kLinger:
      case Phase::kClosed:
        return;
    }
  }

  void parse() {
    boost::system::error_code ec;
    while (!parser_->is_done()) {
      if (buffer_.size() == 0) {
        read();
        return;
      }
      const std::size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec == bhttp::error::need_more) {
        read();
        return;
      }
      if (ec) {
        parse_error(ec);
        return;
      }
      if (phase_ == Phase::kHead && parser_->is_header_done()) on_head();
      if (used == 0 && !parser_->is_done()) {
        read();
        return;
      }
    }
    if (phase_ == Phase::kHead) on_head();
    on_request();
  }

  // The head is in: the body is due within --body-timeout; Expect: 100-continue is answered.
  void on_head() {
    phase_ = Phase::kBody;
    if (parser_->is_done()) return;
    arm(Deadline::kBody, Clock::now() + seconds(limits().body_timeout_s));
    const auto& h = parser_->get();
    const auto expect = h[bhttp::field::expect];
    if (h.version() >= 11 &&
        iequals(std::string_view(expect.data(), expect.size()), "100-continue"))
      enqueue("HTTP/1.1 100 Continue\r\n\r\n");
  }

  void parse_error(const boost::system::error_code& ec) {
    ++srv_.stats_.bad_requests;
    if (ec == bhttp::error::body_limit) {
      fail(413, "the request body is larger than --max-body (" + std::to_string(limits().max_body) +
                    " bytes)");
    } else if (ec == bhttp::error::header_limit) {
      fail(431, "the request head (request line and headers) is larger than " +
                    std::to_string(limits().max_header_bytes) + " bytes");
    } else {
      fail(400, "malformed HTTP request (" + ec.message() + ")");
    }
  }

  // An error the layer answers itself: its JSON body, Connection: close, then lingering close.
  void fail(int status, const std::string& message) {
    arm(Deadline::kNone, {});
    phase_ = Phase::kClosing;
    Response r;
    r.status = status;
    r.content_type = "application/json";
    r.body = srv_.routes_.error_body(status, message);
    write_response(std::move(r), true);
    read();  // what the peer still sends is dropped (its end of file noted)
  }

  // A whole request is in: the routes answer it here or hand it to a worker.
  void on_request() {
    arm(Deadline::kNone, {});
    phase_ = Phase::kBusy;
    bhttp::request<bhttp::string_body> msg = parser_->release();
    parser_.reset();
    Request req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& f : msg)
      req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    req.body = std::move(msg.body());
    req.remote_addr = addr_;
    req.http10 = msg.version() < 11;
    http10_ = req.http10;
    keep_alive_ = msg.keep_alive();
    head_request_ = req.method == "HEAD";
    chunked_ = false;
    Headers common;
    Response res;
    bool answered = true;
    try {
      answered = srv_.routes_.dispatch(req, common, res);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "veloxquant serve: %s %s failed: %s\n", req.method.c_str(),
                   req.path.c_str(), e.what());
      res = internal_error();
    }
    if (!answered) {
      auto ex = std::shared_ptr<Exchange>(new Exchange(std::move(req), common, weak_from_this()));
      net::io_context& io = impl_.io;
      ex->post_ = [&io](std::function<void()> f) { net::post(io, std::move(f)); };
      Server& srv = srv_;
      if (impl_.pool.try_run([ex, &srv] { Server::Impl::work(srv, ex); })) {
        exchange_ = std::move(ex);
        ++srv_.stats_.exchanges_open;
        hold_ = shared_from_this();  // the reply comes from the worker
        read();                      // a client that goes away is seen at once
        return;
      }
      ++srv_.stats_.workers_refused;
      res = Response{};
      res.status = 503;
      res.content_type = "application/json";
      res.set_header("Retry-After", "1");
      res.body = srv_.routes_.error_body(503, "every request handler is busy (--http-workers " +
                                                  std::to_string(limits().workers) + "); retry");
    }
    for (const auto& [k, v] : common)
      if (res.header(k).empty()) res.headers.emplace_back(k, v);
    const bool close = res.close;
    write_response(std::move(res), close);
  }

  Response internal_error() const {
    Response r;
    r.status = 500;
    r.content_type = "application/json";
    r.body = srv_.routes_.error_body(500, "internal error (logged by the server)");
    return r;
  }

  // ---- writing ----

  void write_response(Response r, bool close) {
    const bool body = has_body(r.status);
    const bool closing = decide_close(close);
    std::string out = serialize_head(r, false, body ? static_cast<std::int64_t>(r.body.size()) : -1,
                                     closing, http10_);
    if (body && !head_request_) out += r.body;
    complete_ = true;
    enqueue(std::move(out));
  }

  void enqueue(std::string data) {
    if (phase_ == Phase::kClosed) return;
    out_ += data;
    if (!writing_) flush();
  }

  void flush() {
    if (out_.empty()) {
      drained();
      return;
    }
    wbuf_.swap(out_);
    out_.clear();
    writing_ = true;
    const std::uint64_t gen = ++write_gen_;
    auto self = shared_from_this();
    write_timer_.expires_after(seconds(limits().write_timeout_s));
    write_timer_.async_wait([self, gen](const boost::system::error_code& ec) {
      if (ec || self->phase_ == Phase::kClosed || !self->writing_ || gen != self->write_gen_)
        return;
      ++self->srv_.stats_.write_timeouts;
      self->close();  // the client stopped reading: dropped, its exchange gone
    });
    net::async_write(socket_, net::buffer(wbuf_),
                     [self](const boost::system::error_code& ec, std::size_t) {
                       self->writing_ = false;
                       self->write_timer_.cancel();
                       if (self->phase_ == Phase::kClosed) return;
                       if (ec) {
                         self->close();
                         return;
                       }
                       self->flush();
                     });
  }

  // Everything queued is written: a complete reply ends here.
  void drained() {
    if (!complete_) return;
    complete_ = false;
    ++responses_;
    end_exchange(false);
    if (close_after_ || phase_ == Phase::kClosing) {
      linger();
      return;
    }
    // The next request on this connection (maybe already buffered, maybe read already).
    begin_request(Clock::now(), true);
  }

  // The exchange (if any) is over: written (gone = false) or abandoned (true).
  void end_exchange(bool gone) {
    if (!exchange_) return;
    if (gone) exchange_->mark_gone();
    exchange_->finished();
    exchange_.reset();
    --srv_.stats_.exchanges_open;
    hold_.reset();
  }

  // Our side is shut after a last reply; what the peer still sends is read and dropped for a
  // short while, so that its unread request bytes do not turn our close into a reset that
  // destroys the reply before it reads it.
  void linger() {
    phase_ = Phase::kLinger;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (peer_closed_ || ec) {
      close();
      return;
    }
    arm(Deadline::kLinger, Clock::now() + linger_);
    read();
  }

  void arm(Deadline d, Clock::time_point at) {
    deadline_ = d;
    const std::uint64_t gen = ++read_gen_;
    if (d == Deadline::kNone) {
      read_timer_.cancel();
      return;
    }
    read_timer_.expires_at(at);
    auto self = shared_from_this();
    read_timer_.async_wait([self, gen](const boost::system::error_code& ec) {
      if (!ec && gen == self->read_gen_) self->on_deadline();
    });
  }

  void on_deadline() {
    if (phase_ == Phase::kClosed) return;
    switch (deadline_) {
      case Deadline::kIdle:
        ++srv_.stats_.keep_alive_closed;
        close();
        return;
      case Deadline::kHead:
        ++srv_.stats_.header_timeouts;
        fail(408, "the request head did not arrive within --header-timeout (" +
                      format_seconds(limits().header_timeout_s) + " s)");
        return;
      case Deadline::kBody:
        ++srv_.stats_.body_timeouts;
        fail(408, "the request body did not arrive within --body-timeout (" +
                      format_seconds(limits().body_timeout_s) + " s)");
        return;
      case Deadline::kLinger:
        close();
        return;
      case Deadline::kNone:
        return;
    }
  }

  static std::string format_seconds(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", s);
    return b;
  }

  Server& srv_;
  Server::Impl& impl_;
  tcp::socket socket_;
  net::steady_timer read_timer_, write_timer_;
  const std::string addr_;
  const bool counted_;  // in the open-connection counts (not a rejected one)
  Phase phase_ = Phase::kHead;
  Deadline deadline_ = Deadline::kNone;
  std::uint64_t read_gen_ = 0, write_gen_ = 0;
  Clock::time_point head_deadline_{};
  Clock::duration linger_ = std::chrono::seconds(2);
  boost::beast::flat_buffer buffer_;  // received, not yet parsed
  std::array<char, 16384> rbuf_;      // the pending read's
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bool reading_ = false, writing_ = false;
  std::string out_, wbuf_;  // queued and in-flight output
  bool complete_ = false;   // the reply is entirely queued
  bool close_after_ = false, keep_alive_ = true, http10_ = false, head_request_ = false;
  bool chunked_ = false;
  bool peer_closed_ = false;
  std::int64_t responses_ = 0, dropped_ = 0;
  std::shared_ptr<Exchange> exchange_;
  std::shared_ptr<Connection> hold_;  // alive while a worker may still reply
};

// ---- Exchange ---------------------------------------------------------------------------------

Exchange::~Exchange() = default;

void Exchange::on_gone(std::function<void()> f) {
  {
    std::lock_guard lock(m_);
    if (done_) return;
    if (!gone_.load()) {
      on_gone_ = std::move(f);
      return;
    }
  }
  f();
}

void Exchange::mark_gone() {
  gone_ = true;
  std::function<void()> f;
  {
    std::lock_guard lock(m_);
    if (done_) return;
    f = std::move(on_gone_);
    on_gone_ = nullptr;
  }
  if (f) f();
}

void Exchange::finished() {
  std::lock_guard lock(m_);
  done_ = true;
  on_gone_ = nullptr;
}

void Exchange::respond(Response r) {
  if (answered_) return;
  answered_ = true;
  if (gone_) return;
  post_([w = conn_, ex = this, keep = shared_from_this(), r = std::move(r)]() mutable {
    if (auto c = w.lock()) c->exchange_respond(ex, std::move(r));
  });
}

bool Exchange::begin_stream(Response head) {
  if (answered_) return !gone_;
  answered_ = streaming_ = true;
  if (gone_) return false;
  post_([w = conn_, ex = this, keep = shared_from_this(), h = std::move(head)]() mutable {
    if (auto c = w.lock()) c->exchange_begin(ex, std::move(h));
  });
  return true;
}

bool Exchange::send_chunk(std::string data) {
  if (gone_) return false;
  post_([w = conn_, ex = this, keep = shared_from_this(), d = std::move(data)]() mutable {
    if (auto c = w.lock()) c->exchange_chunk(ex, std::move(d));
  });
  return true;
}

void Exchange::end_stream() {
  if (!streaming_ || ended_) return;
  ended_ = true;
  if (gone_) return;
  post_([w = conn_, ex = this, keep = shared_from_this()] {
    if (auto c = w.lock()) c->exchange_end(ex);
  });
}

// ---- Server -----------------------------------------------------------------------------------

Server::Server(Limits limits, Routes routes)
    : limits_(limits), routes_(std::move(routes)), impl_(std::make_unique<Impl>(limits.workers)) {}

Server::~Server() { impl_->pool.join(); }

int Server::bind(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  boost::system::error_code ec;
  tcp::resolver resolver(impl_->io);
  const auto found = resolver.resolve(host, std::to_string(port), ec);
  if (ec || found.empty())
    throw Error(ErrorCode::kIoError, "cannot bind to " + where + ": --host '" + host +
                                         "' is not an address of this machine (" + ec.message() +
                                         ")");
  const tcp::endpoint ep = found.begin()->endpoint();
  tcp::acceptor& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  // SO_REUSEADDR only (a restarted server binds at once); never SO_REUSEPORT, which would let
  // a second server bind the same port and take half its connections.
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (ec) {
    const bool in_use = ec == net::error::address_in_use;
    boost::system::error_code ignored;
    a.close(ignored);
    throw Error(ErrorCode::kIoError,
                "cannot bind to " + where +
                    (in_use ? ": the address is already in use (another server listens there)"
                            : " (not an address of this machine: " + ec.message() + ")"));
  }
  a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw Error(ErrorCode::kIoError, "cannot listen on " + where + ": " + ec.message());
  // Room for --max-connections descriptors (the soft limit is often 1024).
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    const rlim_t want = static_cast<rlim_t>(limits_.max_connections) + 256;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
      rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  return a.local_endpoint().port();
}

void Server::Impl::accept(Server& srv) {
  acceptor.async_accept([this, &srv](const boost::system::error_code& ec, tcp::socket s) {
    if (stopped) return;
    if (ec) {
      // Out of descriptors (or another transient failure): try again shortly, never spin.
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this, &srv](const boost::system::error_code& e) {
        if (!e && !stopped) accept(srv);
      });
      return;
    }
    on_accept(srv, std::move(s));
    accept(srv);
  });
}

// A new connection: served, or past a cap answered 503 at once and closed.
void Server::Impl::on_accept(Server& srv, tcp::socket s) {
  boost::system::error_code ec;
  const tcp::endpoint peer = s.remote_endpoint(ec);
  if (ec) return;                         // already gone
  s.set_option(tcp::no_delay(true), ec);  // a stream's events leave as they are written
  std::string addr = peer.address().to_string();
  const Limits& l = srv.limits_;
  auto it = per_address.find(addr);
  const std::int64_t from_addr = it == per_address.end() ? 0 : it->second;
  std::string why;
  if (srv.stats_.connections_open >= l.max_connections) {
    why = "too many connections (--max-connections " + std::to_string(l.max_connections) + ")";
  } else if (l.max_connections_per_address > 0 && from_addr >= l.max_connections_per_address) {
    why = "too many connections from " + addr + " (--max-connections-per-address " +
          std::to_string(l.max_connections_per_address) + ")";
    ++srv.stats_.rejected_per_address;
  }
  if (!why.empty()) {
    ++srv.stats_.rejected_total;
    Response r;
    r.status = 503;
    r.content_type = "application/json";
    r.set_header("Retry-After", "1");
    r.body = srv.routes_.error_body(503, why + "; retry later");
    auto c = std::make_shared<Connection>(srv, std::move(s), std::move(addr), false);
    c->reject(std::move(r));
    return;
  }
  ++per_address[addr];
  ++srv.stats_.connections_open;
  ++srv.stats_.connections_total;
  std::make_shared<Connection>(srv, std::move(s), std::move(addr), true)->start();
}

// On a worker: the route's handler; a reply it leaves unanswered (or an exception) is a 500
// with a fixed message, the exception's text on stderr only.
void Server::Impl::work(Server& srv, const std::shared_ptr<Exchange>& ex) {
  ++srv.stats_.workers_busy;
  try {
    srv.routes_.work(ex);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "veloxquant serve: %s %s failed: %s\n", ex->request().method.c_str(),
                 ex->request().path.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "veloxquant serve: %s %s failed\n", ex->request().method.c_str(),
                 ex->request().path.c_str());
  }
  if (!ex->answered()) {
    Response r;
    r.status = 500;
    r.content_type = "application/json";
    r.body = srv.routes_.error_body(500, "internal error (logged by the server)");
    ex->respond(std::move(r));
  }
  ex->end_stream();  // a stream its handler left open (no-op otherwise)
  --srv.stats_.workers_busy;
}

void Server::run() {
  impl_->accept(*this);
  impl_->io.run();
  // stop(): every connection is closed, so every exchange is gone and its handler ends.
  impl_->pool.join();
  impl_->io.restart();
  impl_->io.run();  // the last posts of the workers, now no-ops
}

void Server::stop() {
  net::post(impl_->io, [this] {
    Impl& i = *impl_;
    if (i.stopped) return;
    i.stopped = true;
    boost::system::error_code ec;
    i.acceptor.close(ec);
    i.accept_retry.cancel();
    std::vector<std::shared_ptr<Connection>> open;
    for (auto& [p, w] : i.conns)
      if (auto c = w.lock()) open.push_back(std::move(c));
    for (auto& c : open) c->close();
  });
}

}  // namespace vq::serve::http
