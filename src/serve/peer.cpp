#include "serve/peer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace vq::serve {
namespace {

// The port of an IP socket address; -1 for another family.
int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// Whether an IP socket address is (host, port), the host spelled as getnameinfo's
// NI_NUMERICHOST spells it (as cpp-httplib does).
bool is_at(const sockaddr_storage& a, socklen_t len, const std::string& host, int port) {
  if (port_of(a) != port) return false;
  char h[NI_MAXHOST];
  return getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, nullptr, 0,
                     NI_NUMERICHOST) == 0 &&
         host == h;
}

}  // namespace

int connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                      int remote_port) {
  if (local_port < 0 || remote_port < 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  const int dir_fd = dirfd(dir);
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dir_fd) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t peer_len = sizeof peer, self_len = sizeof self;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &self_len) != 0)
      continue;
    if (!is_at(peer, peer_len, remote_addr, remote_port) ||
        !is_at(self, self_len, local_addr, local_port))
      continue;
    found = static_cast<int>(fd);
    break;
  }
  closedir(dir);
  return found;
}

bool peer_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;  // nothing to read (or EINTR): still there
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;  // end of file: the peer closed
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return false;  // bytes waiting (a pipelined request): the peer is there
}

}  // namespace vq::serve
