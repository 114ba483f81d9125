/* Blocking-with-timeout TCP helpers for bootstrap and connection setup. Every socket is
 * bound to NCCL_ABI_IFACE_ADDR (and NCCL_ABI_IFACE_NAME if set) so that a rank's traffic
 * leaves from "its" NIC. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

/* NCCL_ABI_SNDBUF: SO_SNDBUF of every connection (a window-limited transport, honestly). */
static void sock_sndbuf(int fd) {
  const char* v = getenv("NCCL_ABI_SNDBUF");
  int n = v != NULL ? atoi(v) : 0;
  if (n > 0 && setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &n, sizeof n) != 0)
    abi_warn("SO_SNDBUF %d: %s", n, strerror(errno));
}

void sock_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int sock_new(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sock_nodelay(fd);
  sock_sndbuf(fd);
  const char* ifname = abi_env()->ifname;
  if (ifname != NULL &&
      setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ifname, (socklen_t)strlen(ifname)) != 0)
    abi_warn("SO_BINDTODEVICE %s: %s", ifname, strerror(errno));
  return fd;
}

void sock_set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void sock_set_block(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

int sock_listen(struct in_addr addr, uint16_t* port_out) {
  int fd = sock_new();
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = addr, .sin_port = 0};
  socklen_t len = sizeof sa;
  if (bind(fd, (struct sockaddr*)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0 ||
      getsockname(fd, (struct sockaddr*)&sa, &len) != 0) {
    abi_warn("listen on %s: %s", inet_ntoa(addr), strerror(errno));
    close(fd);
    return -1;
  }
  *port_out = ntohs(sa.sin_port);
  return fd;
}

/* Waits for fd to become ready; returns 1 ready, 0 timeout, -1 error. */
static int wait_fd(int fd, short events, long timeout_ms) {
  struct pollfd p = {.fd = fd, .events = events};
  for (;;) {
    int r = poll(&p, 1, (int)timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r < 0 ? -1 : r;
  }
}

/* Connects from NCCL_ABI_IFACE_ADDR; retries refused connections (peer not listening yet)
 * until the timeout. */
int sock_connect(struct in_addr addr, uint16_t port, long timeout_ms) {
  uint64_t deadline = abi_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  struct sockaddr_in dst = {.sin_family = AF_INET, .sin_addr = addr, .sin_port = htons(port)};
  struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr = abi_env()->iface};
  for (;;) {
    int fd = sock_new();
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr*)&src, sizeof src) != 0) {
      abi_warn("bind to %s: %s", inet_ntoa(src.sin_addr), strerror(errno));
      close(fd);
      return -1;
    }
    sock_set_nonblock(fd);
    int rc = connect(fd, (struct sockaddr*)&dst, sizeof dst);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      uint64_t now = abi_now_ns();
      long left = now < deadline ? (long)((deadline - now) / 1000000ull) + 1 : 0;
      if (wait_fd(fd, POLLOUT, left) == 1) {
        socklen_t l = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
      } else {
        err = ETIMEDOUT;
      }
    }
    if (err == 0) {
      sock_set_block(fd);
      return fd;
    }
    close(fd);
    if ((err != ECONNREFUSED && err != EAGAIN) || abi_now_ns() >= deadline) {
      abi_warn("connect to %s:%u: %s", inet_ntoa(addr), port, strerror(err));
      return -1;
    }
    usleep(20000);
  }
}

int sock_accept(int lfd, long timeout_ms) {
  if (wait_fd(lfd, POLLIN, timeout_ms) != 1) return -1;
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd >= 0) {
    sock_nodelay(fd);
    sock_sndbuf(fd);
  }
  return fd;
}

static ncclResult_t sock_io(int fd, void* buf, size_t len, long timeout_ms, int is_send) {
  uint64_t deadline = abi_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  char* p = buf;
  while (len > 0) {
    uint64_t now = abi_now_ns();
    if (now >= deadline) return ncclRemoteError;
    int w = wait_fd(fd, is_send ? POLLOUT : POLLIN, (long)((deadline - now) / 1000000ull) + 1);
    if (w < 0) return ncclSystemError;
    if (w == 0) continue;
    ssize_t n = is_send ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, p, len, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return ncclRemoteError; /* peer closed or reset */
    p += n;
    len -= (size_t)n;
  }
  return ncclSuccess;
}

ncclResult_t sock_send_all(int fd, const void* buf, size_t len, long timeout_ms) {
  return sock_io(fd, (void*)buf, len, timeout_ms, 1);
}

ncclResult_t sock_recv_all(int fd, void* buf, size_t len, long timeout_ms) {
  return sock_io(fd, buf, len, timeout_ms, 0);
}
