#ifndef IDFILE_H_
#define IDFILE_H_
#include "nccl.h"
/* Both exit(1) with a message on failure; id_read waits up to 120 s for the file. */
void id_write(const char* path, const ncclUniqueId* id);
void id_read(const char* path, ncclUniqueId* id);
#endif
