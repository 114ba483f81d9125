#include "stepcommon.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static long parse_long(const char* name, const char* s, long min, const char* usage) {
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < min) {
    fprintf(stderr, "bad %s '%s'\n%s", name, s, usage);
    exit(2);
  }
  return v;
}

void step_parse(int argc, char** argv, struct step_opts* o, int with_rank, const char* usage) {
  static const struct option opts[] = {
      {"rank", required_argument, 0, 'r'},       {"nranks", required_argument, 0, 'n'},
      {"id-file", required_argument, 0, 'f'},    {"steps", required_argument, 0, 's'},
      {"bytes", required_argument, 0, 'b'},      {"compute-us", required_argument, 0, 'c'},
      {"marker-socket", required_argument, 0, 'm'}, {"delay-rank", required_argument, 0, 'D'},
      {"delay-us", required_argument, 0, 'U'},   {"delay-every", required_argument, 0, 'E'},
      {"no-verify", no_argument, 0, 'V'},        {"help", no_argument, 0, 'h'},
      {"stop-rank", required_argument, 0, 'S'},  {"stop-step", required_argument, 0, 'K'},
      {"vary-us", required_argument, 0, 'Y'},   {"start-at-us", required_argument, 0, 'T'},
      {"period-us", required_argument, 0, 'P'},
      {"desync-rank", required_argument, 0, 'R'}, {"desync-step", required_argument, 0, 'k'},
      {"desync-mode", required_argument, 0, 'M'},
      {0, 0, 0, 0}};
  *o = (struct step_opts){.rank = -1, .nranks = -1, .steps = 10, .bytes = 1 << 20,
                          .compute_us = 10000, .delay_rank = -1, .delay_every = 1, .verify = 1,
                          .stop_rank = -1, .desync_rank = -1, .desync_mode = DESYNC_OP};
  int c;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
      case 'r': o->rank = (int)parse_long("--rank", optarg, 0, usage); break;
      case 'n': o->nranks = (int)parse_long("--nranks", optarg, 1, usage); break;
      case 'f': o->id_file = optarg; break;
      case 's': o->steps = parse_long("--steps", optarg, 0, usage); break;
      case 'b': o->bytes = (size_t)parse_long("--bytes", optarg, 4, usage); break;
      case 'c': o->compute_us = parse_long("--compute-us", optarg, 0, usage); break;
      case 'm': o->marker_socket = optarg; break;
      case 'D': o->delay_rank = (int)parse_long("--delay-rank", optarg, 0, usage); break;
      case 'U': o->delay_us = parse_long("--delay-us", optarg, 0, usage); break;
      case 'E': o->delay_every = parse_long("--delay-every", optarg, 1, usage); break;
      case 'V': o->verify = 0; break;
      case 'S': o->stop_rank = (int)parse_long("--stop-rank", optarg, 0, usage); break;
      case 'K': o->stop_step = parse_long("--stop-step", optarg, 0, usage); break;
      case 'Y': o->vary_us = parse_long("--vary-us", optarg, 0, usage); break;
      case 'T': o->start_at_us = (double)parse_long("--start-at-us", optarg, 1, usage); break;
      case 'P': o->period_us = parse_long("--period-us", optarg, 1, usage); break;
      case 'R': o->desync_rank = (int)parse_long("--desync-rank", optarg, 0, usage); break;
      case 'k': o->desync_step = parse_long("--desync-step", optarg, 0, usage); break;
      case 'M':
        if (strcmp(optarg, "op") == 0) o->desync_mode = DESYNC_OP;
        else if (strcmp(optarg, "count") == 0) o->desync_mode = DESYNC_COUNT;
        else if (strcmp(optarg, "skip") == 0) o->desync_mode = DESYNC_SKIP;
        else { fprintf(stderr, "bad --desync-mode '%s'\n%s", optarg, usage); exit(2); }
        break;
      case 'h': fputs(usage, stdout); exit(0);
      default: fputs(usage, stderr); exit(2);
    }
  }
  int bad = optind != argc;
  if (with_rank)
    bad |= o->rank < 0 || o->nranks < 1 || o->rank >= o->nranks || o->id_file == NULL;
  else
    bad |= o->rank >= 0 || o->nranks >= 0 || o->id_file != NULL;
  bad |= (o->start_at_us > 0) != (o->period_us > 0);
  if (bad) {
    fputs(usage, stderr);
    exit(2);
  }
  o->bytes -= o->bytes % sizeof(float);
}

double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Sleeps us microseconds, resuming after a signal. */
static void sleep_us(long us) {
  struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

void busy_wait_us(long us) {
  double end = now_us() + (double)us;
  /* STEPS_COMPUTE=sleep: compute is a sleep instead of a spin, so many ranks on few cores
   * keep their timing (tests that measure injected delays use it). */
  const char* mode = getenv("STEPS_COMPUTE");
  if (mode && strcmp(mode, "sleep") == 0) {
    sleep_us(us);
    return;
  }
  while (now_us() < end) {
  }
}

long step_delay_us(const struct step_opts* o, int rank, long k) {
  long vary = 0;
  if (o->vary_us > 0 && rank == (int)(k % 4)) {
    uint64_t h = (uint64_t)k * 0x9e3779b97f4a7c15ull;
    h ^= h >> 31;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 29;
    vary = (long)(h % 1001) * o->vary_us / 1000;
  }
  if (rank != o->delay_rank || (k + 1) % o->delay_every != 0) return vary;
  return vary + o->delay_us;
}

void step_pace(const struct step_opts* o, long k) {
  if (o->period_us <= 0) return;
  double wait = o->start_at_us + (double)k * (double)o->period_us - now_us();
  if (wait > 0) sleep_us((long)wait);
}

void step_stop_point(const struct step_opts* o, int rank, long k) {
  if (rank != o->stop_rank || k != o->stop_step) return;
  printf("stopping rank=%d step=%ld pid=%d\n", rank, k, (int)getpid());
  fflush(stdout);
  raise(SIGSTOP);
}

void markers_open(struct markers* m, const char* path) {
  m->path = path;
  m->fd = path ? socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0) : -1;
}

void marker_send(struct markers* m, int rank, long step, const char* phase) {
  if (m->fd < 0) return;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strncpy(a.sun_path, m->path, sizeof a.sun_path - 1);
  char line[128];
  int n = snprintf(line, sizeof line, "{\"rank\":%d,\"step\":%ld,\"phase\":\"%s\"}", rank,
                   step, phase);
  sendto(m->fd, line, (size_t)n, MSG_DONTWAIT, (struct sockaddr*)&a, sizeof a);
}

void fill_input(float* buf, size_t n, int rank, long step) {
  for (size_t i = 0; i < n; i++) buf[i] = (float)(rank + 1) + (float)((i + (size_t)step) % 13);
}

size_t check_sum(const float* buf, size_t n, int nranks, long step) {
  size_t bad = 0;
  float base = (float)nranks * (float)(nranks + 1) / 2.0f;
  for (size_t i = 0; i < n; i++)
    if (buf[i] != base + (float)nranks * (float)((i + (size_t)step) % 13)) bad++;
  return bad;
}

uint64_t checksum64(const void* buf, size_t bytes) {
  const unsigned char* p = buf;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void stats_init(struct step_stats* s, long steps) {
  s->comm_us = calloc((size_t)steps + 1, sizeof(double));
  s->step_us = calloc((size_t)steps + 1, sizeof(double));
  s->n = 0;
  if (!s->comm_us || !s->step_us) {
    perror("calloc");
    exit(1);
  }
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(const double* v, long n) {
  if (n == 0) return 0;
  double* c = malloc(sizeof(double) * (size_t)n);
  memcpy(c, v, sizeof(double) * (size_t)n);
  qsort(c, (size_t)n, sizeof(double), cmp_double);
  double m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
  free(c);
  return m;
}

static double mean(const double* v, long n) {
  double s = 0;
  for (long i = 0; i < n; i++) s += v[i];
  return n ? s / (double)n : 0;
}

void stats_print_summary(const struct step_stats* s, const char* tool, int rank, int nranks,
                         size_t bytes, uint64_t csum, size_t errors) {
  printf("summary tool=%s rank=%d nranks=%d steps=%ld bytes=%zu comm_us_mean=%.1f "
         "comm_us_median=%.1f step_us_mean=%.1f step_us_median=%.1f checksum=%016llx "
         "errors=%zu\n",
         tool, rank, nranks, s->n, bytes, mean(s->comm_us, s->n), median(s->comm_us, s->n),
         mean(s->step_us, s->n), median(s->step_us, s->n), (unsigned long long)csum, errors);
  fflush(stdout);
}
