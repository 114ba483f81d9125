/*
 * Windowed transport over TCP with the names and signatures of NCCL's internal IB
 * transport (docs/platform-facts.md "NCCL's internal network calls"), so that probes written
 * for ncclIbIsend/ncclIbIrecv/ncclIbTest in real NCCL attach to the same symbols here.
 *
 * A send request completes only when the receiver has acknowledged its chunk, which is
 * what makes throughput window * chunk / RTT when the window is small. ncclIbTest does
 * the socket I/O of the request's connection (like NCCL's socket net plugin does in its
 * test call); only the proxy thread calls these functions.
 *
 * Wire format, per chunk: struct msg_hdr then the payload; per received chunk the
 * receiver writes one struct msg_ack back on the same connection.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"

#define MSG_MAGIC 0x4e43434cu /* "NCCL" */
#define ACK_MAGIC 0x41434b21u /* "ACK!" */

struct msg_hdr {
  uint32_t magic;
  int32_t tag;
  uint64_t size;
};

struct msg_ack {
  uint32_t magic;
  uint32_t seq;
};

enum { REQ_IO = 0, REQ_WIRE = 1, REQ_DONE = 2 };

struct req {
  struct conn* c;
  char* data;
  size_t size;       /* send: payload; recv: capacity, then the received size */
  int tag;
  int state;
  uint64_t due_ns;   /* send: completes no earlier (NCCL_ABI_RTT_US) */
  struct msg_hdr hdr;
  size_t hdr_off, data_off;
  struct req* next;
};

struct conn {
  int fd, peer, is_send;
  ncclResult_t err;               /* sticky */
  struct req *head, *tail;        /* send: written or being written, not acked; recv: posted */
  struct req* wcur;               /* send: first request with bytes left to write */
  uint32_t seq;                   /* acks received (send) or sent (recv) */
  struct msg_ack ack;             /* send: ack being read */
  size_t ack_off;
  uint32_t acks_owed;             /* recv: acks not yet written */
  struct msg_ack ack_out;
  size_t ack_out_off;             /* recv: bytes of ack_out written; 0 = none in progress */
};

/* Bytes moved by this thread's transport calls; the proxy sleeps in poll() when a pass
 * over its requests leaves it unchanged. */
static __thread uint64_t tl_moved;
/* Earliest time a send request held back by NCCL_ABI_RTT_US may complete (0: none). */
static __thread uint64_t tl_next_due;

HIDDEN uint64_t transport_moved(void) { return tl_moved; }

HIDDEN uint64_t transport_take_next_due(void) {
  uint64_t d = tl_next_due;
  tl_next_due = 0;
  return d;
}

struct conn* conn_new(int fd, int peer, int is_send) {
  struct conn* c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->fd = fd;
  c->peer = peer;
  c->is_send = is_send;
  sock_set_nonblock(fd);
  return c;
}

void conn_free(struct conn* c) {
  if (c == NULL) return;
  for (struct req *r = c->head, *n; r; r = n) {
    n = r->next;
    free(r);
  }
  close(c->fd);
  free(c);
}

void conn_abort(struct conn* c) {
  if (c != NULL) shutdown(c->fd, SHUT_RDWR);
}

int conn_fd(const struct conn* c) { return c->fd; }

short conn_poll_events(const struct conn* c) {
  if (c->is_send) return (short)(POLLIN | (c->wcur ? POLLOUT : 0));
  return (short)((c->head ? POLLIN : 0) | (c->acks_owed || c->ack_out_off ? POLLOUT : 0));
}

static ncclResult_t conn_fail(struct conn* c, ncclResult_t rc, const char* what, int err) {
  if (c->err == ncclSuccess) {
    abi_warn("%s peer %d: %s (%s)", c->is_send ? "send to" : "receive from", c->peer, what,
             err ? strerror(err) : "closed");
    c->err = rc;
  }
  return c->err;
}

/* Returns >0 bytes moved, 0 would block, <0 error (c->err set). */
static ssize_t io_result(struct conn* c, ssize_t n, const char* what) {
  if (n > 0) {
    tl_moved += (uint64_t)n;
    return n;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  conn_fail(c, ncclRemoteError, what, n < 0 ? errno : 0);
  return -1;
}

static ncclResult_t progress_send(struct conn* c) {
  while (c->wcur != NULL) {
    struct req* r = c->wcur;
    struct iovec iov[2];
    int k = 0;
    if (r->hdr_off < sizeof r->hdr)
      iov[k++] = (struct iovec){(char*)&r->hdr + r->hdr_off, sizeof r->hdr - r->hdr_off};
    if (r->data_off < r->size)
      iov[k++] = (struct iovec){r->data + r->data_off, r->size - r->data_off};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t n = io_result(c, sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT), "write");
    if (n < 0) return c->err;
    if (n == 0) break;
    size_t h = sizeof r->hdr - r->hdr_off;
    if ((size_t)n < h) {
      r->hdr_off += (size_t)n;
      continue;
    }
    r->hdr_off = sizeof r->hdr;
    r->data_off += (size_t)n - h;
    if (r->data_off == r->size) {
      r->state = REQ_WIRE;
      if (abi_env()->rtt_us > 0)
        r->due_ns = abi_now_ns() + (uint64_t)abi_env()->rtt_us * 1000ull;
      c->wcur = r->next;
    }
  }
  /* Only while a request waits for its ack: a peer that has all its acks sent may close,
   * and that end of file is not an error. */
  while (c->head != NULL) {
    ssize_t n = io_result(c, recv(c->fd, (char*)&c->ack + c->ack_off,
                                  sizeof c->ack - c->ack_off, MSG_DONTWAIT), "read ack");
    if (n < 0) return c->err;
    if (n == 0) break;
    c->ack_off += (size_t)n;
    if (c->ack_off < sizeof c->ack) continue;
    c->ack_off = 0;
    struct req* r = c->head;
    if (c->ack.magic != ACK_MAGIC || c->ack.seq != c->seq || r == NULL || r->state != REQ_WIRE)
      return conn_fail(c, ncclInternalError, "protocol error: unexpected ack", 0);
    c->seq++;
    r->state = REQ_DONE;
    c->head = r->next;
    if (c->head == NULL) c->tail = NULL;
  }
  return ncclSuccess;
}

static ncclResult_t progress_recv(struct conn* c) {
  while (c->head != NULL) {
    struct req* r = c->head;
    ssize_t n;
    if (r->hdr_off < sizeof r->hdr) {
      n = io_result(c, recv(c->fd, (char*)&r->hdr + r->hdr_off, sizeof r->hdr - r->hdr_off,
                            MSG_DONTWAIT), "read");
      if (n < 0) return c->err;
      if (n == 0) break;
      r->hdr_off += (size_t)n;
      if (r->hdr_off < sizeof r->hdr) continue;
      if (r->hdr.magic != MSG_MAGIC || r->hdr.tag != r->tag || r->hdr.size > r->size)
        return conn_fail(c, ncclInternalError,
                         "protocol error: chunk tag/size does not match the posted receive "
                         "(NCCL_ABI_CHUNK or the call's count differ between ranks?)", 0);
      r->size = r->hdr.size;
    }
    if (r->data_off < r->size) {
      n = io_result(c, recv(c->fd, r->data + r->data_off, r->size - r->data_off, MSG_DONTWAIT),
                    "read");
      if (n < 0) return c->err;
      if (n == 0) break;
      r->data_off += (size_t)n;
    }
    if (r->data_off == r->size) {
      r->state = REQ_DONE;
      c->head = r->next;
      if (c->head == NULL) c->tail = NULL;
      c->acks_owed++;
    }
  }
  int acked = 0;
  while (c->acks_owed > 0 || c->ack_out_off > 0) {
    if (c->ack_out_off == 0) c->ack_out = (struct msg_ack){ACK_MAGIC, c->seq};
    ssize_t n = io_result(c, send(c->fd, (char*)&c->ack_out + c->ack_out_off,
                                  sizeof c->ack_out - c->ack_out_off,
                                  MSG_NOSIGNAL | MSG_DONTWAIT), "write ack");
    if (n < 0) return c->err;
    if (n == 0) break;
    c->ack_out_off += (size_t)n;
    if (c->ack_out_off == sizeof c->ack_out) {
      c->ack_out_off = 0;
      c->acks_owed--;
      c->seq++;
      acked = 1;
    }
  }
  /* Acks leave at once. Linux's TCP autocorking (net.ipv4.tcp_autocorking, on by default,
   * TCP_NODELAY or not) holds a small write while the connection's previous packet still
   * waits in a qdisc: an ack written while the last one sat in the link's queue behind this
   * rank's data left only with it, by which time this rank could have queued its next
   * transfer's data ahead of it, and the sender waited for the ack until that data drained
   * (38-100 ms at 10 Mbit/s; 7 of 180 steps of two 2-rank jobs in the congestion scenario's
   * setting, none once pushed). NCCL's completions do not wait behind the rank's own later
   * data; setting TCP_NODELAY again pushes the pending frames. */
  if (acked) sock_nodelay(c->fd);
  return ncclSuccess;
}

static ncclResult_t progress(struct conn* c) {
  if (c->err != ncclSuccess) return c->err;
  return c->is_send ? progress_send(c) : progress_recv(c);
}

static void enqueue(struct conn* c, struct req* r) {
  if (c->tail) c->tail->next = r;
  else c->head = r;
  c->tail = r;
}

/* The functions below carry NCCL's mangled names (internal.h); noinline and a real
 * prologue so that a uprobe at their entry takes the emulated path (docs/platform-facts.md §6). */

IB_API int ncclIbIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                                                void** request) {
  (void)mhandle;
  (void)phandle;
  struct conn* c = sendComm;
  *request = NULL;
  if (c == NULL || !c->is_send) return ncclInternalError;
  if (c->err != ncclSuccess) return c->err;
  struct req* r = calloc(1, sizeof *r);
  if (r == NULL) return ncclSystemError;
  r->c = c;
  r->data = data;
  r->size = size;
  r->tag = tag;
  r->hdr = (struct msg_hdr){MSG_MAGIC, tag, size};
  enqueue(c, r);
  if (c->wcur == NULL) c->wcur = r;
  *request = r;
  return progress(c);
}

IB_API int ncclIbIrecv(void* recvComm, int n, void** data,
                                                size_t* sizes, int* tags, void** mhandles,
                                                void** phandles, void** request) {
  (void)mhandles;
  (void)phandles;
  struct conn* c = recvComm;
  *request = NULL;
  /* Real NCCL may group up to 8 receives in one request; this transport posts one. */
  if (c == NULL || c->is_send || n != 1) return ncclInternalError;
  if (c->err != ncclSuccess) return c->err;
  struct req* r = calloc(1, sizeof *r);
  if (r == NULL) return ncclSystemError;
  r->c = c;
  r->data = data[0];
  r->size = sizes[0];
  r->tag = tags[0];
  enqueue(c, r);
  *request = r;
  return ncclSuccess;
}

IB_API int ncclIbTest(void* request, int* done, int* sizes) {
  struct req* r = request;
  *done = 0;
  if (r->state != REQ_DONE) {
    ncclResult_t rc = progress(r->c);
    if (r->state != REQ_DONE) return rc;
  }
  /* NCCL_ABI_RTT_US: this kernel has no netem, so link latency is modelled here: a chunk
   * completes no earlier than RTT after its last byte left, as if its ack had to travel. */
  if (r->due_ns != 0) {
    uint64_t now = abi_now_ns();
    if (now < r->due_ns) {
      if (tl_next_due == 0 || r->due_ns < tl_next_due) tl_next_due = r->due_ns;
      return ncclSuccess;
    }
  }
  *done = 1;
  if (sizes != NULL) sizes[0] = (int)r->size;
  free(r);
  return ncclSuccess;
}
