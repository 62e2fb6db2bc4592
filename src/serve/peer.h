// Whether an HTTP client is still there while its request waits (for admission, for the whole
// reply of a non-streamed request, between a stream's tokens). cpp-httplib 0.11.4 gives a
// handler no socket, and its DataSink::is_writable() only polls for POLLOUT, which a socket whose
// peer has closed still reports; so the server finds the connection's socket by its addresses
// and looks at its read side: a peer that closed (FIN) reads as end of file, one that reset
// reads as an error.
#pragma once

#include <string>

namespace vq::serve {

// The descriptor of this process's connected TCP socket whose local end is
// (local_addr, local_port) and whose peer is (remote_addr, remote_port), addresses as
// getnameinfo(NI_NUMERICHOST) spells them (as cpp-httplib's Request fields hold them); -1 when
// none is found. The caller must own the connection for as long as it uses the descriptor (a
// handler does: cpp-httplib closes it only after the response).
int connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                      int remote_port);

// True when the peer of connected socket `fd` has closed its end or reset the connection: the
// socket is readable and a 1-byte MSG_PEEK reads end of file (or fails other than EAGAIN), or
// poll reports POLLHUP/POLLERR. Never blocks and consumes nothing. A peer that sent more bytes
// (a pipelined request) before closing reads as present until those bytes are read. A peer
// that only shut down its write side (half-close) reads as gone: HTTP clients do not
// half-close while they wait for a reply. fd < 0: false.
bool peer_gone(int fd);

}  // namespace vq::serve
