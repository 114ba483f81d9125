/* The unique id travels between ranks as 256 hex digits in a file written atomically
 * (write + rename) by rank 0; the others poll for it. */
#include "idfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void id_write(const char* path, const ncclUniqueId* id) {
  char hex[2 * NCCL_UNIQUE_ID_BYTES + 2];
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id->internal[i]);
  hex[2 * NCCL_UNIQUE_ID_BYTES] = '\n';
  hex[2 * NCCL_UNIQUE_ID_BYTES + 1] = '\0';
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE* f = fopen(tmp, "w");
  if (f == NULL || fputs(hex, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "writing %s: %s\n", path, strerror(errno));
    exit(1);
  }
}

void id_read(const char* path, ncclUniqueId* id) {
  time_t deadline = time(NULL) + 120;
  for (;;) {
    FILE* f = fopen(path, "r");
    if (f != NULL) {
      char hex[2 * NCCL_UNIQUE_ID_BYTES + 8] = {0};
      size_t n = fread(hex, 1, sizeof hex - 1, f);
      fclose(f);
      if (n >= 2 * NCCL_UNIQUE_ID_BYTES) {
        for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
          unsigned v;
          if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            fprintf(stderr, "%s is not a hex unique id\n", path);
            exit(1);
          }
          id->internal[i] = (char)v;
        }
        return;
      }
    }
    if (time(NULL) > deadline) {
      fprintf(stderr, "no id in %s after 120 s\n", path);
      exit(1);
    }
    usleep(10000);
  }
}
