/*
 * xina_mpi_bench: Open MPI's allreduce and broadcast, timed the way the
 * testbed's benches time xina and their TCP baselines.
 *
 * Rank 0 reads commands from standard input, one per line, and every rank
 * runs them:
 *
 *   allreduce int32|float BYTES ITERS REPS
 *   bcast BYTES ITERS REPS
 *   quit                                   (or end of input)
 *
 * and rank 0 answers each with one line on standard output:
 *
 *   xina-mpi allreduce int32 ranks=N bytes=B iters=I reps=R median_ns=M samples_ns=T1,T2,...
 *
 * - allreduce: a repetition fills ITERS result buffers with a poison
 *   pattern, warms up (see warm_again), meets at a barrier, then runs ITERS
 *   MPI_Allreduce (sum) back to back; its sample is (last rank done - first
 *   rank out of the barrier) / ITERS. One sample per repetition.
 * - bcast: after a warm-up (see warm_again), each of the ITERS x REPS
 *   broadcasts is timed on its own, from the first rank out of a barrier to
 *   the slowest receiver's return from MPI_Bcast; the root rotates over the
 *   ranks from broadcast to broadcast.
 *
 * Every rank times with CLOCK_MONOTONIC, which all ranks on one host share.
 * Every result is checked after the clock stops: the allreduce sums against
 * a closed form, every received byte against the root's pattern. A wrong
 * answer prints "xina-mpi: WRONG ..." on standard error and aborts the job
 * with status 3, so no wrong answer is ever reported as a time.
 *
 * At start-up rank 0 prints "xina-mpi ready ranks=N".
 *
 * With the argument "--corrupt-rank R", rank R changes one element (one
 * byte) of every result it gets before checking it: the tests use this to
 * see that a wrong answer fails the run.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LINE_MAX_BYTES 256
#define ERR_WRONG 3
#define ERR_USAGE 2

static int rank, nranks;
static int corrupt_rank = -1;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "xina-mpi: rank %d: cannot allocate %zu bytes\n", rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, ERR_USAGE);
    }
    return p;
}

/*
 * Rank r's element i is a(i) + r * b(i), so the sum over n ranks is
 * n * a(i) + b(i) * n(n-1)/2, checkable without the other ranks' data.
 * |a| < 2^(bits-1) and |b| <= 30: with bits = 20 (int32) every partial sum
 * of up to 64 ranks stays below 2^26, far inside int32; with bits = 12
 * (float) below 2^18, so float sums are exact in any order.
 */
static int32_t elem_a(size_t i, unsigned salt, int bits)
{
    uint32_t h = (uint32_t)i * 2654435761u + salt * 40503u;
    return (int32_t)(h >> (32 - bits)) - (1 << (bits - 1));
}

static int32_t elem_b(size_t i) { return (int32_t)(i % 61) - 30; }

static int64_t expected_sum(size_t i, unsigned salt, int bits)
{
    int64_t n = nranks;
    return n * elem_a(i, salt, bits) + (int64_t)elem_b(i) * (n * (n - 1) / 2);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Prints the answer line on rank 0: the median and every sample. */
static void report(const char *what, size_t bytes, long iters, long reps, const int64_t *samples,
                   long count)
{
    if (rank != 0)
        return;
    int64_t *sorted = xmalloc((size_t)count * sizeof *sorted);
    memcpy(sorted, samples, (size_t)count * sizeof *sorted);
    qsort(sorted, (size_t)count, sizeof *sorted, cmp_i64);
    int64_t median = count % 2 ? sorted[count / 2]
                               : (sorted[count / 2 - 1] + sorted[count / 2]) / 2;
    free(sorted);
    printf("xina-mpi %s ranks=%d bytes=%zu iters=%ld reps=%ld median_ns=%lld samples_ns=", what,
           nranks, bytes, iters, reps, (long long)median);
    for (long k = 0; k < count; k++)
        printf("%s%lld", k ? "," : "", (long long)samples[k]);
    printf("\n");
    fflush(stdout);
}

/* First rank out of the barrier to the last rank done, on rank 0. */
static int64_t span(int64_t start, int64_t end)
{
    int64_t first = 0, last = 0;
    MPI_Reduce(&start, &first, 1, MPI_INT64_T, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&end, &last, 1, MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
    return last - first;
}

/*
 * Whether to warm up once more: rank 0 decides (until its clock passes
 * `until`) and tells every rank.
 *
 * Before its clock starts, a command warms up with the collective it times,
 * again and again for WARM_UP_NS (at least once), as osu_allreduce's
 * skipped iterations do. A command starts after its ranks slept between
 * commands (wait_for_command), for seconds while the other implementations
 * ran, and was timed cold: TCP restarts from its initial window after an
 * idle RTO (tcp_slow_start_after_idle), and the sleepers take about 100 ms
 * of running to get back to speed. 8 workers on 2 CPUs, medians of 20
 * commands of 20 allreduces of 8 B: 210-270 us straight after waking,
 * 200-250 us after 20 allreduces of warm-up, 170-190 us after 200 ms (as
 * with ranks that spun between commands instead of sleeping). In `bench
 * allreduce` at 8 workers (xina and the ring in between), four runs:
 * 8 B 204-212 us before, 170-194 after; 64 MiB 747-971 ms before, 500-541
 * ms after.
 */
#define WARM_UP_NS 200000000

static int warm_again(int64_t until)
{
    int more = rank == 0 && now_ns() < until;
    MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return more;
}

static void allreduce(int is_float, size_t bytes, long iters, long reps)
{
    MPI_Datatype type = is_float ? MPI_FLOAT : MPI_INT32_T;
    size_t count = bytes / 4;
    int bits = is_float ? 12 : 20;
    int32_t *in_i = xmalloc(count * 4);
    float *in_f = (float *)in_i;
    void **out = xmalloc((size_t)iters * sizeof *out);
    for (long k = 0; k < iters; k++)
        out[k] = xmalloc(count * 4);
    int64_t *samples = xmalloc((size_t)reps * sizeof *samples);
    for (long rep = 0; rep < reps; rep++) {
        unsigned salt = (unsigned)(rep + 1) * 7919u + (unsigned)bytes;
        for (size_t i = 0; i < count; i++) {
            int32_t v = elem_a(i, salt, bits) + rank * elem_b(i);
            if (is_float)
                in_f[i] = (float)v;
            else
                in_i[i] = v;
        }
        /* A repetition's allreduces, warming up (see warm_again). */
        int64_t until = now_ns() + WARM_UP_NS;
        do {
            for (long k = 0; k < iters; k++)
                MPI_Allreduce(in_i, out[0], (int)count, type, MPI_SUM, MPI_COMM_WORLD);
        } while (warm_again(until));
        for (long k = 0; k < iters; k++)
            memset(out[k], 0xa5, count * 4);
        MPI_Barrier(MPI_COMM_WORLD);
        int64_t start = now_ns();
        for (long k = 0; k < iters; k++)
            MPI_Allreduce(in_i, out[k], (int)count, type, MPI_SUM, MPI_COMM_WORLD);
        int64_t end = now_ns();
        if (rank == corrupt_rank && count > 0)
            for (long k = 0; k < iters; k++)
                ((int32_t *)out[k])[count - 1] ^= 1;
        for (long k = 0; k < iters; k++) {
            for (size_t i = 0; i < count; i++) {
                int64_t want = expected_sum(i, salt, bits);
                int64_t got = is_float ? (int64_t)((float *)out[k])[i] : ((int32_t *)out[k])[i];
                int exact = is_float ? ((float *)out[k])[i] == (float)want : got == want;
                if (!exact) {
                    fprintf(stderr,
                            "xina-mpi: WRONG allreduce result: rank %d, %zu bytes, repetition %ld, "
                            "call %ld, element %zu: %lld (expected %lld)\n",
                            rank, bytes, rep, k, i, (long long)got, (long long)want);
                    fflush(stderr);
                    MPI_Abort(MPI_COMM_WORLD, ERR_WRONG);
                }
            }
        }
        samples[rep] = span(start, end) / iters;
    }
    report(is_float ? "allreduce float" : "allreduce int32", bytes, iters, reps, samples, reps);
    free(samples);
    for (long k = 0; k < iters; k++)
        free(out[k]);
    free(out);
    free(in_i);
}

static uint8_t pattern(size_t i, unsigned salt) { return (uint8_t)((i * 131u + salt) ^ (i >> 9)); }

static void bcast(size_t bytes, long iters, long reps)
{
    uint8_t *buf = xmalloc(bytes);
    long count = iters * reps;
    int64_t *samples = xmalloc((size_t)count * sizeof *samples);
    /* Broadcasts from every root in turn, warming up (see warm_again). */
    int64_t until = now_ns() + WARM_UP_NS;
    int warm_root = 0;
    do {
        MPI_Bcast(buf, (int)bytes, MPI_BYTE, warm_root, MPI_COMM_WORLD);
        warm_root = (warm_root + 1) % nranks;
    } while (warm_again(until));
    for (long s = 0; s < count; s++) {
        int root = (int)(s % nranks);
        unsigned salt = (unsigned)s * 2654435761u + (unsigned)bytes;
        for (size_t i = 0; i < bytes; i++)
            buf[i] = rank == root ? pattern(i, salt) : (uint8_t)~pattern(i, salt);
        MPI_Barrier(MPI_COMM_WORLD);
        int64_t start = now_ns();
        MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
        /* The root's return is not a receiver's last byte. */
        int64_t end = rank == root ? INT64_MIN : now_ns();
        if (rank == corrupt_rank && rank != root)
            buf[bytes - 1] ^= 1;
        for (size_t i = 0; i < bytes; i++) {
            if (buf[i] != pattern(i, salt)) {
                fprintf(stderr,
                        "xina-mpi: WRONG broadcast data: rank %d, %zu bytes from root %d, "
                        "broadcast %ld, byte %zu: 0x%02x (expected 0x%02x)\n",
                        rank, bytes, root, s, i, buf[i], pattern(i, salt));
                fflush(stderr);
                MPI_Abort(MPI_COMM_WORLD, ERR_WRONG);
            }
        }
        samples[s] = span(start, end);
    }
    report("bcast bytes", bytes, iters, reps, samples, count);
    free(samples);
    free(buf);
}

/* A command as every rank receives it from rank 0. */
struct command {
    int32_t op; /* 0 quit, 1 allreduce int32, 2 allreduce float, 3 bcast */
    int32_t pad;
    int64_t bytes, iters, reps;
};

static struct command parse(const char *line)
{
    struct command c = {0};
    char what[32] = "", type[32] = "";
    long long bytes = 0, iters = 0, reps = 0;
    int ok = 0;
    if (sscanf(line, "%31s", what) != 1 || !strcmp(what, "quit"))
        return c;
    if (!strcmp(what, "allreduce") &&
        sscanf(line, "%*s %31s %lld %lld %lld", type, &bytes, &iters, &reps) == 4) {
        c.op = !strcmp(type, "int32") ? 1 : !strcmp(type, "float") ? 2 : -1;
        ok = c.op > 0 && bytes > 0 && bytes % 4 == 0;
    } else if (!strcmp(what, "bcast") &&
               sscanf(line, "%*s %lld %lld %lld", &bytes, &iters, &reps) == 3) {
        c.op = 3;
        ok = bytes > 0;
    }
    ok = ok && iters > 0 && reps > 0 && bytes <= INT32_MAX;
    if (!ok) {
        fprintf(stderr,
                "xina-mpi: cannot parse %s(expected \"allreduce int32|float BYTES ITERS REPS\", "
                "\"bcast BYTES ITERS REPS\" or \"quit\")\n",
                line);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, ERR_USAGE);
    }
    c.bytes = bytes;
    c.iters = iters;
    c.reps = reps;
    return c;
}

/*
 * Hands rank 0's command to every rank. Between commands the other
 * implementations of the bench run on the same CPUs, so an idle rank must
 * not spin in MPI's progress loop (as a blocking MPI_Bcast would, yielding
 * or not): it tests a non-blocking broadcast every millisecond and sleeps
 * in between. That adds up to a millisecond before a command starts, never
 * inside a timed collective; the warm-up (warm_again) runs the ranks back
 * to speed before the clock starts.
 */
static void wait_for_command(struct command *c)
{
    MPI_Request request;
    int done = 0;
    const struct timespec nap = {0, 1000000};
    MPI_Ibcast(c, sizeof *c, MPI_BYTE, 0, MPI_COMM_WORLD, &request);
    for (;;) {
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (done)
            break;
        nanosleep(&nap, NULL);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int a = 1; a + 1 < argc; a++)
        if (!strcmp(argv[a], "--corrupt-rank"))
            corrupt_rank = atoi(argv[a + 1]);
    if (rank == 0) {
        printf("xina-mpi ready ranks=%d\n", nranks);
        fflush(stdout);
    }
    for (;;) {
        struct command c = {0};
        char line[LINE_MAX_BYTES];
        if (rank == 0 && fgets(line, sizeof line, stdin))
            c = parse(line);
        wait_for_command(&c);
        if (c.op == 0)
            break;
        if (c.op == 3)
            bcast((size_t)c.bytes, (long)c.iters, (long)c.reps);
        else
            allreduce(c.op == 2, (size_t)c.bytes, (long)c.iters, (long)c.reps);
    }
    MPI_Finalize();
    return 0;
}
