/* Shared by the training-loop drivers nccl_steps and mpi_steps: options, busy-wait
 * compute, step markers, deterministic data and its check. */
#ifndef STEPCOMMON_H_
#define STEPCOMMON_H_

#include <stddef.h>
#include <stdint.h>

struct step_opts {
  int rank, nranks;          /* nccl_steps only (MPI knows them) */
  const char* id_file;       /* nccl_steps only */
  long steps;
  size_t bytes;
  long compute_us;
  const char* marker_socket; /* NULL: no markers */
  int delay_rank;            /* -1: none */
  long delay_us;
  long delay_every;
  int verify;
  int stop_rank;  /* -1: none; else this rank SIGSTOPs itself before step stop_step's collective */
  long stop_step;
  long vary_us;   /* rank k % 4 computes 0..vary_us longer at step k (deterministic per step) */
  double start_at_us; /* --start-at-us: CLOCK_MONOTONIC us of step 0's collective; 0: no pacing */
  long period_us;     /* --period-us: step k's collective at start_at_us + k * period_us */
  int desync_rank;    /* -1: none; else this rank's call at step desync_step disagrees */
  long desync_step;
  int desync_mode;    /* DESYNC_OP, DESYNC_COUNT or DESYNC_SKIP */
};

enum { DESYNC_OP = 1, DESYNC_COUNT = 2, DESYNC_SKIP = 3 };

/* Parses argv; on a usage error prints usage and exits 2. with_rank: --rank, --nranks and
 * --id-file are accepted and required. */
void step_parse(int argc, char** argv, struct step_opts* o, int with_rank, const char* usage);

double now_us(void);
/* Spins on the CPU (not sleeping) until us microseconds of wall time have passed. */
void busy_wait_us(long us);
/* The extra compute this rank does at step k: delay_us when it is the delayed rank and
 * (k+1) % delay_every == 0, i.e. on the delay_every-th, 2*delay_every-th ... step. */
long step_delay_us(const struct step_opts* o, int rank, long k);
/* With --start-at-us T --period-us P: sleeps until T + k * P (CLOCK_MONOTONIC) when that is
 * later than now, so that step k's collective is issued then, whatever the step before took:
 * jobs given one T run in phase, and stay so. The wait counts as the step's CPU compute. */
void step_pace(const struct step_opts* o, long k);
/* Called just before step k's collective: the --stop-rank rank prints "stopping …" and
 * stops itself with SIGSTOP at --stop-step (it goes on when sent SIGCONT). */
void step_stop_point(const struct step_opts* o, int rank, long k);

/* One-line JSON markers {"rank":R,"step":k,"phase":"begin"|"end"} as datagrams to a Unix
 * socket; errors (nobody listening) are ignored. */
struct markers {
  int fd;
  const char* path;
};
void markers_open(struct markers* m, const char* path);
void marker_send(struct markers* m, int rank, long step, const char* phase);

/* Rank r's input at step k: element i = (r+1) + ((i+k) % 13), exact in float32. */
void fill_input(float* buf, size_t n, int rank, long step);
/* Number of elements of a sum over nranks inputs that are not what they must be. */
size_t check_sum(const float* buf, size_t n, int nranks, long step);
uint64_t checksum64(const void* buf, size_t bytes);

/* Per-step timings and the summary line, in microseconds. */
struct step_stats {
  double* comm_us;
  double* step_us;
  long n;
};
void stats_init(struct step_stats* s, long steps);
void stats_print_summary(const struct step_stats* s, const char* tool, int rank, int nranks,
                         size_t bytes, uint64_t csum, size_t errors);

#endif
