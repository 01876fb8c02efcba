/* Runs functions of a TVM CPU library without TVM: built by the cross compiler of a foreign CPU
 * and run under user-mode emulation (qemu-user), it loads a candidate's library, gives it the
 * runtime entry points it takes from TVM when loaded there (workspace, parallel launch and
 * barrier on POSIX threads, error reporting), and calls its functions on buffers read from files,
 * then writes every buffer back. stormdrop/tvm_compat/emulated.py builds and drives it.
 *
 *   emulated_main LIB THREADS (-b CODE:BITS:LANES:D0xD1x... FILE)... (-c FUNCTION I,J,...)...
 *
 * -b: one buffer (DLPack dtype code, bits, lanes, shape; a 0-d buffer is shape "-"), read from
 * and written back to FILE; -c: call FUNCTION with buffers I, J, ... (indices of -b, in order).
 * Exit status 0, or 1 with one line on stderr. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>

#define MAX_BUFFERS 64
#define MAX_CALLS 8
#define MAX_DIMS 8

typedef struct {
  void* sync_handle;
  int32_t num_task;
} ParallelEnv;
typedef int (*ParallelLambda)(int task_id, ParallelEnv* env, void* cdata);
typedef int (*SafeCall)(void* handle, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

static int g_threads = 1;

static void die(const char* what, const char* detail) {
  fprintf(stderr, "emulated_main: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(1);
}

static char g_error[2048] = "no error message";

/* the library reports a failed check (a shape, a dtype) here before returning non-zero */
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t num_parts) {
  size_t used = (size_t)snprintf(g_error, sizeof(g_error), "%s: ", kind ? kind : "Error");
  for (int32_t i = 0; i < num_parts && used < sizeof(g_error); ++i)
    used += (size_t)snprintf(g_error + used, sizeof(g_error) - used, "%s", parts[i] ? parts[i] : "");
  for (char* p = g_error; *p; ++p)
    if (*p == '\n') *p = ' ';
}

void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message) {
  const char* parts[1] = {message};
  TVMFFIErrorSetRaisedFromCStrParts(kind, parts, 1);
}

static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int code, int bits) {
  (void)device_type, (void)device_id, (void)code, (void)bits;
  void* p = NULL;
  return posix_memalign(&p, 64, nbytes ? nbytes : 1) == 0 ? p : NULL;
}

static int free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  free(ptr);
  return 0;
}

typedef struct {
  ParallelLambda body;
  void* cdata;
  ParallelEnv* env;
  int task_id;
  int status;
} Task;

static void* run_task(void* arg) {
  Task* t = (Task*)arg;
  t->status = t->body(t->task_id, t->env, t->cdata);
  return NULL;
}

/* every task on its own thread, as TVM's pool runs them: a barrier between them works */
static int parallel_launch(ParallelLambda body, void* cdata, int num_task) {
  int n = num_task > 0 ? num_task : g_threads;
  pthread_barrier_t barrier;
  ParallelEnv env = {&barrier, n};
  Task* tasks = calloc((size_t)n, sizeof(Task));
  pthread_t* threads = calloc((size_t)n, sizeof(pthread_t));
  if (!tasks || !threads || pthread_barrier_init(&barrier, NULL, (unsigned)n) != 0) die("parallel launch", "out of memory");
  for (int i = 0; i < n; ++i) {
    tasks[i] = (Task){body, cdata, &env, i, 0};
    if (i > 0 && pthread_create(&threads[i], NULL, run_task, &tasks[i]) != 0) die("parallel launch", "no thread");
  }
  run_task(&tasks[0]);
  int status = tasks[0].status;
  for (int i = 1; i < n; ++i) {
    pthread_join(threads[i], NULL);
    if (tasks[i].status) status = tasks[i].status;
  }
  pthread_barrier_destroy(&barrier);
  free(tasks);
  free(threads);
  return status;
}

static int parallel_barrier(int task_id, ParallelEnv* env) {
  (void)task_id;
  int rc = pthread_barrier_wait((pthread_barrier_t*)env->sync_handle);
  return rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD ? 0 : -1;
}

static void set_entry(void* lib, const char* name, void* value) {
  void** slot = (void**)dlsym(lib, name);
  if (slot) *slot = value;  /* a library that never calls it has no slot */
}

typedef struct {
  DLTensor t;
  int64_t shape[MAX_DIMS];
  const char* path;
  size_t nbytes;
} Buffer;

static void parse_buffer(const char* spec, const char* path, Buffer* b) {
  int code, bits, lanes, used = 0;
  if (sscanf(spec, "%d:%d:%d:%n", &code, &bits, &lanes, &used) != 3) die("bad buffer", spec);
  memset(b, 0, sizeof(*b));
  b->path = path;
  b->t.device.device_type = kDLCPU;
  b->t.dtype.code = (uint8_t)code, b->t.dtype.bits = (uint8_t)bits, b->t.dtype.lanes = (uint16_t)lanes;
  size_t count = 1;
  const char* dims = spec + used;
  if (strcmp(dims, "-") != 0) {
    for (const char* p = dims; *p;) {
      char* end;
      long long d = strtoll(p, &end, 10);
      if (end == p || d < 0 || b->t.ndim == MAX_DIMS) die("bad shape", spec);
      b->shape[b->t.ndim++] = d;
      count *= (size_t)d;
      p = *end == 'x' ? end + 1 : end;
      if (*end && *end != 'x') die("bad shape", spec);
    }
  }
  b->t.shape = b->shape;
  b->nbytes = count * (size_t)((bits * lanes + 7) / 8);
  if (posix_memalign(&b->t.data, 64, b->nbytes ? b->nbytes : 1) != 0) die("out of memory", spec);
  FILE* f = fopen(path, "rb");
  if (!f || fread(b->t.data, 1, b->nbytes, f) != b->nbytes) die("cannot read", path);
  fclose(f);
}

static void write_buffer(const Buffer* b) {
  FILE* f = fopen(b->path, "wb");
  if (!f || fwrite(b->t.data, 1, b->nbytes, f) != b->nbytes) die("cannot write", b->path);
  fclose(f);
}

int main(int argc, char** argv) {
  if (argc < 3) die("usage", "LIB THREADS (-b SPEC FILE)... (-c FUNCTION I,J,...)...");
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (!lib) die("cannot load", dlerror());
  g_threads = atoi(argv[2]) > 0 ? atoi(argv[2]) : 1;
  set_entry(lib, "__TVMBackendAllocWorkspace", (void*)alloc_workspace);
  set_entry(lib, "__TVMBackendFreeWorkspace", (void*)free_workspace);
  set_entry(lib, "__TVMBackendParallelLaunch", (void*)parallel_launch);
  set_entry(lib, "__TVMBackendParallelBarrier", (void*)parallel_barrier);

  static Buffer buffers[MAX_BUFFERS];
  int nbuf = 0;
  const char* calls[MAX_CALLS][2];
  int ncall = 0;
  for (int i = 3; i < argc; i += 3) {
    if (i + 2 >= argc) die("usage", "an option without its two values");
    if (strcmp(argv[i], "-b") == 0 && nbuf < MAX_BUFFERS) {
      parse_buffer(argv[i + 1], argv[i + 2], &buffers[nbuf++]);
    } else if (strcmp(argv[i], "-c") == 0 && ncall < MAX_CALLS) {
      calls[ncall][0] = argv[i + 1], calls[ncall][1] = argv[i + 2], ++ncall;
    } else {
      die("usage", argv[i]);
    }
  }
  for (int c = 0; c < ncall; ++c) {
    char symbol[256];
    snprintf(symbol, sizeof(symbol), "__tvm_ffi_%s", calls[c][0]);
    SafeCall fn = (SafeCall)dlsym(lib, symbol);
    if (!fn) die("no function", calls[c][0]);
    TVMFFIAny args[MAX_BUFFERS];
    int nargs = 0;
    for (const char* p = calls[c][1]; *p;) {
      char* end;
      long k = strtol(p, &end, 10);
      if (end == p || k < 0 || k >= nbuf || nargs == MAX_BUFFERS) die("bad call", calls[c][1]);
      memset(&args[nargs], 0, sizeof(TVMFFIAny));
      args[nargs].type_index = kTVMFFIDLTensorPtr;
      args[nargs].v_ptr = &buffers[k].t;
      ++nargs;
      p = *end == ',' ? end + 1 : end;
    }
    TVMFFIAny result;
    memset(&result, 0, sizeof(result));
    result.type_index = kTVMFFINone;
    if (fn(NULL, args, nargs, &result) != 0) {
      fprintf(stderr, "emulated_main: %s failed: %s\n", calls[c][0], g_error);
      return 1;
    }
  }
  for (int i = 0; i < nbuf; ++i) write_buffer(&buffers[i]);
  return 0;
}
