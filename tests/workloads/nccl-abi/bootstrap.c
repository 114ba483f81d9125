/*
 * Rendezvous over TCP, like NCCL's bootstrap: ncclGetUniqueId starts a root thread
 * listening on NCCL_ABI_IFACE_ADDR and encodes its address into the 128-byte id; every
 * rank connects to it, reports where its own data listener is, and gets everyone's back.
 * Then each rank opens one TCP connection to every peer (full mesh, one direction per
 * connection: the connecting side writes data and reads acks).
 */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "internal.h"

#define ID_MARKER 0x42415753u /* "SWAB" */

struct id_layout {     /* lives in ncclUniqueId.internal */
  uint64_t magic;      /* random per id; also authenticates every connection */
  uint32_t marker;
  uint32_t ip;         /* root address, network order */
  uint16_t port;       /* root port, host order */
};
_Static_assert(sizeof(struct id_layout) <= NCCL_UNIQUE_ID_BYTES, "id layout");

struct hello {         /* rank -> root */
  uint64_t magic;
  int32_t nranks, rank;
  struct peer_info info;
};

struct conn_hello {    /* connecting rank -> accepting rank */
  uint64_t magic;
  int32_t from, to;
};

struct root_args {
  int lfd;
  uint64_t magic;
};

static void* root_main(void* argp) {
  struct root_args a = *(struct root_args*)argp;
  free(argp);
  long timeout = abi_env()->init_timeout_ms;
  uint64_t deadline = abi_now_ns() + (uint64_t)timeout * 1000000ull;
  int nranks = 0, got = 0;
  int* fds = NULL;
  struct peer_info* all = NULL;
  while (nranks == 0 || got < nranks) {
    uint64_t now = abi_now_ns();
    if (now >= deadline) {
      abi_warn("bootstrap root: %d of %d ranks arrived before NCCL_ABI_INIT_TIMEOUT_MS", got,
               nranks);
      goto out;
    }
    int fd = sock_accept(a.lfd, (long)((deadline - now) / 1000000ull) + 1);
    if (fd < 0) continue;
    struct hello h;
    if (sock_recv_all(fd, &h, sizeof h, timeout) != ncclSuccess || h.magic != a.magic ||
        h.nranks < 1 || h.rank < 0 || h.rank >= h.nranks || (nranks && h.nranks != nranks) ||
        (fds && fds[h.rank] >= 0)) {
      abi_warn("bootstrap root: rejected a bad or duplicate hello");
      close(fd);
      continue;
    }
    if (nranks == 0) {
      nranks = h.nranks;
      fds = malloc(sizeof(int) * (size_t)nranks);
      all = calloc((size_t)nranks, sizeof *all);
      if (!fds || !all) goto out;
      for (int i = 0; i < nranks; i++) fds[i] = -1;
    }
    fds[h.rank] = fd;
    all[h.rank] = h.info;
    got++;
  }
  for (int i = 0; i < nranks; i++)
    sock_send_all(fds[i], all, sizeof *all * (size_t)nranks, timeout);
out:
  for (int i = 0; fds && i < nranks; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
  free(all);
  close(a.lfd);
  return NULL;
}

ncclResult_t bootstrap_new_id(ncclUniqueId* id) {
  struct id_layout l;
  memset(&l, 0, sizeof l); /* padding too: the id is hashed as 128 raw bytes */
  l.marker = ID_MARKER;
  if (getrandom(&l.magic, sizeof l.magic, 0) != sizeof l.magic) return ncclSystemError;
  struct in_addr ip = abi_env()->iface;
  int lfd = sock_listen(ip, &l.port);
  if (lfd < 0) return ncclSystemError;
  l.ip = ip.s_addr;
  struct root_args* a = malloc(sizeof *a);
  if (a == NULL) {
    close(lfd);
    return ncclSystemError;
  }
  a->lfd = lfd;
  a->magic = l.magic;
  pthread_t t;
  if (pthread_create(&t, NULL, root_main, a) != 0) {
    free(a);
    close(lfd);
    return ncclSystemError;
  }
  pthread_detach(t);
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &l, sizeof l);
  abi_log("unique id: root %s:%u", inet_ntoa(ip), l.port);
  return ncclSuccess;
}

ncclResult_t bootstrap_exchange(const ncclUniqueId* id, int nranks, int rank,
                                const struct peer_info* mine, struct peer_info* all,
                                uint64_t* magic) {
  struct id_layout l;
  memcpy(&l, id->internal, sizeof l);
  if (l.marker != ID_MARKER) {
    abi_warn("ncclUniqueId was not made by ncclGetUniqueId of this library");
    return ncclInvalidArgument;
  }
  long timeout = abi_env()->init_timeout_ms;
  struct in_addr root = {.s_addr = l.ip};
  int fd = sock_connect(root, l.port, timeout);
  if (fd < 0) return ncclRemoteError;
  struct hello h = {.magic = l.magic, .nranks = nranks, .rank = rank, .info = *mine};
  ncclResult_t rc = sock_send_all(fd, &h, sizeof h, timeout);
  if (rc == ncclSuccess) rc = sock_recv_all(fd, all, sizeof *all * (size_t)nranks, timeout);
  close(fd);
  if (rc != ncclSuccess) abi_warn("bootstrap with root %s:%u failed", inet_ntoa(root), l.port);
  *magic = l.magic;
  return rc;
}

static uint64_t fnv1a(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

uint64_t abi_host_key(int rank) {
  const struct abi_env* e = abi_env();
  if (e->host != NULL) return fnv1a(e->host);
  if (e->local_size > 0) return (uint64_t)(rank / e->local_size) + 1;
  return 0;
}

/* Hosts are numbered in order of their lowest rank. Hierarchical needs every host to
 * hold the same number of ranks (that is what NCCL_ABI_LOCAL_SIZE promises): strict (a
 * communicator from ncclCommInitRank*) fails otherwise, a split one falls back to ring. */
ncclResult_t comm_setup_hosts(struct ncclComm* comm, const struct peer_info* all, int strict) {
  int n = comm->nranks;
  comm->host_of = calloc((size_t)n, sizeof(int));
  int* count = calloc((size_t)n, sizeof(int));
  if (!comm->host_of || !count) {
    free(count);
    return ncclSystemError;
  }
  comm->nhosts = 0;
  for (int r = 0; r < n; r++) {
    int h = -1;
    for (int q = 0; q < r && h < 0; q++)
      if (all[q].host == all[r].host) h = comm->host_of[q];
    if (h < 0) h = comm->nhosts++;
    comm->host_of[r] = h;
    count[h]++;
  }
  comm->local_size = count[comm->host_of[comm->rank]];
  int uniform = 1;
  for (int h = 0; h < comm->nhosts; h++) uniform &= count[h] == comm->local_size;
  free(count);
  const struct abi_env* e = abi_env();
  if (comm->algo_hier && !strict && !uniform) {
    comm->algo_hier = 0; /* a split communicator with uneven hosts: flat ring */
  } else if (comm->algo_hier && strict &&
             (!uniform || (e->local_size && e->local_size != comm->local_size))) {
    abi_warn("NCCL_ABI_ALGO=hierarchical needs the same number of ranks on every host "
             "(NCCL_ABI_LOCAL_SIZE=%d, this host has %d of %d ranks on %d hosts)",
             e->local_size, comm->local_size, n, comm->nhosts);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

/* Overrides the peers' advertised addresses with NCCL_ABI_PEER_ADDRS, if set. */
void bootstrap_peer_addrs(int nranks, struct peer_info* all) {
  const char* list = abi_env()->peer_addrs;
  if (list == NULL) return;
  char* copy = strdup(list);
  char* save = NULL;
  int i = 0;
  for (char* tok = strtok_r(copy, ",", &save); tok && i < nranks;
       tok = strtok_r(NULL, ",", &save), i++) {
    struct in_addr a;
    if (inet_pton(AF_INET, tok, &a) == 1) all[i].ip = a.s_addr;
    else abi_warn("NCCL_ABI_PEER_ADDRS: bad address '%s' for rank %d, ignored", tok, i);
  }
  if (i < nranks) abi_warn("NCCL_ABI_PEER_ADDRS lists %d addresses for %d ranks", i, nranks);
  free(copy);
}

ncclResult_t comm_connect(struct ncclComm* comm, const struct peer_info* all) {
  int n = comm->nranks, me = comm->rank;
  long timeout = abi_env()->init_timeout_ms;
  comm->send = calloc((size_t)n, sizeof *comm->send);
  comm->recv = calloc((size_t)n, sizeof *comm->recv);
  if (!comm->send || !comm->recv) return ncclSystemError;
  /* Connecting first is safe: the kernel completes handshakes into the listen backlog. */
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    struct in_addr a = {.s_addr = all[p].ip};
    int fd = sock_connect(a, all[p].port, timeout);
    if (fd < 0) return ncclRemoteError;
    struct conn_hello h = {.magic = comm->magic, .from = me, .to = p};
    if (sock_send_all(fd, &h, sizeof h, timeout) != ncclSuccess) {
      close(fd);
      return ncclRemoteError;
    }
    comm->send[p] = conn_new(fd, p, 1);
    if (comm->send[p] == NULL) return ncclSystemError;
  }
  for (int got = 0; got < n - 1;) {
    int fd = sock_accept(comm->listen_fd, timeout);
    if (fd < 0) {
      abi_warn("rank %d: only %d of %d peers connected", me, got, n - 1);
      return ncclRemoteError;
    }
    struct conn_hello h;
    if (sock_recv_all(fd, &h, sizeof h, timeout) != ncclSuccess || h.magic != comm->magic ||
        h.to != me || h.from < 0 || h.from >= n || h.from == me || comm->recv[h.from]) {
      abi_warn("rank %d: rejected a bad connection hello", me);
      close(fd);
      continue;
    }
    comm->recv[h.from] = conn_new(fd, h.from, 0);
    if (comm->recv[h.from] == NULL) return ncclSystemError;
    got++;
  }
  return ncclSuccess;
}
