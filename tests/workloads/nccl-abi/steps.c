/*
 * nccl_steps: a training loop over the NCCL API. Each step queues the simulated GPU compute
 * (--gpu-compute-ms, ncclAbiEnqueueCompute), does the CPU compute (a busy-wait, so real CPU
 * time), enqueues one ncclAllReduce of --bytes (float32 sum) on the same stream and waits
 * for the stream (ncclAbiStreamSynchronize, like a training loop's .item()); step markers
 * bracket the step. Rank 0 makes the unique id and publishes it in --id-file (hex, written
 * atomically); the other ranks wait for that file. The launcher removes a stale file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "idfile.h"
#include "nccl.h"
#include "stepcommon.h"

static const char usage[] =
    "usage: nccl_steps --rank R --nranks N --id-file F [--steps S] [--bytes B]\n"
    "                  [--compute-us C] [--marker-socket PATH] [--delay-rank R --delay-us D\n"
    "                  [--delay-every K]] [--no-verify] [--gpu-compute-ms G]\n"
    "                  [--gpu-delay-rank R --gpu-delay-ms M [--gpu-delay-every K]]\n"
    "                  [--start-at-us T --period-us P] [--graph]\n"
    "  Steps of G ms simulated GPU compute queued on the stream, C us CPU busy-wait, one\n"
    "  ncclAllReduce of B bytes (float32 sum) queued after it, then a stream synchronize.\n"
    "  --delay-*: rank R computes D us longer on the CPU on every K-th step (a late\n"
    "  enqueue). --gpu-delay-*: rank R's stream computes M ms longer on every K-th step\n"
    "  (its GPU is late while its CPU enqueues on time).\n"
    "  --start-at-us/--period-us: step k's collective is issued at CLOCK_MONOTONIC T + k*P us\n"
    "  at the earliest (the CPU compute waits for it): jobs given one T stay in phase.\n"
    "  --graph: the all-reduce is captured once (ncclAbiStreamBeginCapture) before the\n"
    "  loop and each step replays it (ncclAbiGraphLaunch): no NCCL call in the loop.\n"
    "  Library knobs (NCCL_ABI_*) are described in nccl-abi/README.md.\n";

#define NCCLCHECK(call, what)                                                         \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      fprintf(stderr, "nccl_steps rank %d: %s failed: %s (%d)\n", o.rank, what,       \
              ncclGetErrorString(r_), (int)r_);                                       \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

struct gpu_opts {
  double compute_ms, delay_ms;
  int delay_rank;
  long delay_every;
};

static double num_arg(const char* name, const char* v, double min) {
  char* end = NULL;
  double x = v ? strtod(v, &end) : 0;
  if (v == NULL || *v == '\0' || *end != '\0' || !(x >= min)) {
    fprintf(stderr, "nccl_steps: bad %s '%s'\n%s", name, v ? v : "", usage);
    exit(2);
  }
  return x;
}

/* Takes the --gpu-* options out of argv (the rest goes to step_parse). */
static int take_gpu_opts(int argc, char** argv, struct gpu_opts* g) {
  static const char* const names[] = {"--gpu-compute-ms", "--gpu-delay-rank", "--gpu-delay-ms",
                                      "--gpu-delay-every"};
  *g = (struct gpu_opts){.delay_rank = -1, .delay_every = 1};
  int out = 1;
  for (int i = 1; i < argc; i++) {
    int which = -1;
    const char* val = NULL;
    for (int n = 0; n < 4 && which < 0; n++) {
      size_t len = strlen(names[n]);
      if (strncmp(argv[i], names[n], len) != 0) continue;
      if (argv[i][len] == '=') val = argv[i] + len + 1, which = n;
      else if (argv[i][len] == '\0') val = i + 1 < argc ? argv[++i] : NULL, which = n;
    }
    if (which < 0) {
      argv[out++] = argv[i];
      continue;
    }
    double x = num_arg(names[which], val, which == 3 ? 1 : 0);
    if (which == 0) g->compute_ms = x;
    else if (which == 1) g->delay_rank = (int)x;
    else if (which == 2) g->delay_ms = x;
    else g->delay_every = (long)x;
  }
  argv[out] = NULL;
  return out;
}

static double gpu_ms(const struct gpu_opts* g, int rank, long k) {
  int late = rank == g->delay_rank && (k + 1) % g->delay_every == 0;
  return g->compute_ms + (late ? g->delay_ms : 0);
}

/* Takes --graph out of argv. */
static int take_graph(int* argc, char** argv) {
  int out = 1, graph = 0;
  for (int i = 1; i < *argc; i++) {
    if (strcmp(argv[i], "--graph") == 0) graph = 1;
    else argv[out++] = argv[i];
  }
  argv[out] = NULL;
  *argc = out;
  return graph;
}

int main(int argc, char** argv) {
  struct step_opts o;
  struct gpu_opts g;
  int graph_mode = take_graph(&argc, argv);
  argc = take_gpu_opts(argc, argv, &g);
  step_parse(argc, argv, &o, 1, usage);
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclUniqueId id;
  if (o.rank == 0) {
    NCCLCHECK(ncclGetUniqueId(&id), "ncclGetUniqueId");
    id_write(o.id_file, &id);
  } else {
    id_read(o.id_file, &id);
  }
  ncclComm_t comm;
  double t_init = now_us();
  NCCLCHECK(ncclCommInitRank(&comm, o.nranks, id, o.rank), "ncclCommInitRank");
  printf("init rank=%d nranks=%d pid=%d init_us=%.0f\n", o.rank, o.nranks, (int)getpid(),
         now_us() - t_init);

  size_t count = o.bytes / sizeof(float);
  float* send = malloc(o.bytes);
  float* recv = malloc(o.bytes);
  if (send == NULL || recv == NULL) {
    perror("malloc");
    return 1;
  }
  ncclAbiGraph_t graph = NULL;
  if (graph_mode) {
    NCCLCHECK(ncclAbiStreamBeginCapture(NULL), "ncclAbiStreamBeginCapture");
    NCCLCHECK(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL),
              "ncclAllReduce (captured)");
    NCCLCHECK(ncclAbiStreamEndCapture(NULL, &graph), "ncclAbiStreamEndCapture");
    printf("captured rank=%d\n", o.rank);
  }
  struct markers m;
  markers_open(&m, o.marker_socket);
  struct step_stats st;
  stats_init(&st, o.steps);
  size_t errors = 0;
  for (long k = 0; k < o.steps; k++) {
    fill_input(send, count, o.rank, k);
    long delay = step_delay_us(&o, o.rank, k);
    double gms = gpu_ms(&g, o.rank, k);
    marker_send(&m, o.rank, k, "begin");
    double t0 = now_us();
    ncclResult_t rc = gms > 0 ? ncclAbiEnqueueCompute(NULL, gms) : ncclSuccess;
    busy_wait_us(o.compute_us + delay);
    step_pace(&o, k);
    step_stop_point(&o, o.rank, k);
    double t1 = now_us();
    if (rc == ncclSuccess)
      rc = graph ? ncclAbiGraphLaunch(graph, NULL)
                 : ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL);
    double t_enq = now_us();
    if (rc == ncclSuccess) rc = ncclAbiStreamSynchronize(NULL);
    double t2 = now_us();
    uint64_t kernel_ns = 0;
    if (rc == ncclSuccess) rc = ncclAbiCommLastKernelBegin(comm, &kernel_ns);
    marker_send(&m, o.rank, k, "end");
    if (rc != ncclSuccess) {
      fprintf(stderr, "nccl_steps rank %d step %ld: ncclAllReduce failed: %s (%d)\n", o.rank,
              k, ncclGetErrorString(rc), (int)rc);
      ncclCommAbort(comm);
      return 1;
    }
    size_t bad = o.verify ? check_sum(recv, count, o.nranks, k) : 0;
    errors += bad;
    st.comm_us[st.n] = t2 - t1;
    st.step_us[st.n++] = t2 - t0;
    printf("step rank=%d step=%ld compute_us=%.0f allreduce_us=%.0f step_us=%.0f delayed=%d "
           "bad=%zu arrive_us=%.1f enqueue_us=%.0f gpu_ms=%.3f kernel_us=%.1f\n",
           o.rank, k, t1 - t0, t2 - t1, t2 - t0, delay > 0, bad, t1, t_enq - t1, gms,
           (double)kernel_ns / 1e3);
  }
  uint64_t csum = o.steps ? checksum64(recv, o.bytes) : 0;
  if (graph) ncclAbiGraphDestroy(graph);
  NCCLCHECK(ncclCommDestroy(comm), "ncclCommDestroy");
  stats_print_summary(&st, "nccl_steps", o.rank, o.nranks, o.bytes, csum, errors);
  return errors ? 3 : 0;
}
