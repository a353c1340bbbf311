/* The testbed's check of the xina PMPI library (userspace/xina-mpi): every
 * intercepted call's result against what the PMPI_ call gives for the same
 * input, for every supported type and op, sizes that do and do not divide
 * into packets, every root, MPI_IN_PLACE; calls the library must pass on
 * (other types, ops, communicators); a communicator duplicated from
 * MPI_COMM_WORLD. Integers must be identical; floats within FLOAT_BOUND
 * (inputs in [-1, 1), at most 8 ranks: the fixed-point error and rounding
 * the sum to float are far below it).
 *
 * Prints "xina-mpi-check: ok CHECKS" on rank 0 and exits 0, or aborts the
 * job naming the first mismatch. With "--only-allreduce", runs int32 sum
 * allreduces of 1,000,000 elements in a loop until killed (for the test
 * that kills a rank mid-allreduce), printing "xina-mpi-check: looping"
 * after the first. With "--thread-multiple", initialises with
 * MPI_Init_thread(MPI_THREAD_MULTIPLE) and runs the checks.
 */

#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLOAT_BOUND 2e-6

static int rank, size;
static long checks;

static void mismatch(const char *what, long at, double got, double want)
{
    fprintf(stderr, "xina-mpi-check: rank %d: MISMATCH %s at %ld: got %.9g, want %.9g\n", rank,
            what, at, got, want);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Element i of rank r's input: spread over the type's range, different on
 * every rank. */
static int32_t int32_of(int r, long i)
{
    return (int32_t)((uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503 + 17)) / 1024;
}

static int64_t int64_of(int r, long i)
{
    return ((int64_t)int32_of(r, i) << 20) ^ (int64_t)(i * 7 + r);
}

static float float_of(int r, long i)
{
    return (float)((int32_of(r, i) % 100000) / 100000.0);
}

static void fill(MPI_Datatype t, void *buf, long n, int r)
{
    for (long i = 0; i < n; i++) {
        if (t == MPI_INT)
            ((int32_t *)buf)[i] = int32_of(r, i);
        else if (t == MPI_FLOAT)
            ((float *)buf)[i] = float_of(r, i);
        else if (t == MPI_DOUBLE)
            ((double *)buf)[i] = float_of(r, i);
        else if (t == MPI_BYTE)
            ((uint8_t *)buf)[i] = (uint8_t)int32_of(r, i);
        else
            ((int64_t *)buf)[i] = int64_of(r, i);
    }
}

static size_t size_of(MPI_Datatype t)
{
    int s;
    MPI_Type_size(t, &s);
    return (size_t)s;
}

static void compare(const char *what, MPI_Datatype t, const void *got, const void *want, long n)
{
    for (long i = 0; i < n; i++) {
        if (t == MPI_FLOAT) {
            double g = ((const float *)got)[i], w = ((const float *)want)[i];
            if (!(fabs(g - w) <= FLOAT_BOUND))
                mismatch(what, i, g, w);
        } else if (t == MPI_INT) {
            if (((const int32_t *)got)[i] != ((const int32_t *)want)[i])
                mismatch(what, i, ((const int32_t *)got)[i], ((const int32_t *)want)[i]);
        } else if (memcmp((const char *)got + i * size_of(t), (const char *)want + i * size_of(t),
                          size_of(t)) != 0) {
            mismatch(what, i, (double)((const int64_t *)got)[i],
                     (double)((const int64_t *)want)[i]);
        }
    }
    checks++;
}

static const char *type_name(MPI_Datatype t)
{
    return t == MPI_INT ? "int" : t == MPI_INT64_T ? "int64" : t == MPI_LONG ? "long"
         : t == MPI_FLOAT ? "float" : t == MPI_DOUBLE ? "double" : "?";
}

static const char *op_name(MPI_Op op)
{
    return op == MPI_SUM ? "sum" : op == MPI_MAX ? "max" : op == MPI_MIN ? "min" : "prod";
}

static void check_allreduce(MPI_Comm comm, MPI_Datatype t, MPI_Op op, long n, int in_place)
{
    size_t bytes = (size_t)n * size_of(t);
    char *in = malloc(bytes), *got = malloc(bytes), *want = malloc(bytes);
    fill(t, in, n, rank);
    PMPI_Allreduce(in, want, (int)n, t, op, comm);
    if (in_place) {
        memcpy(got, in, bytes);
        MPI_Allreduce(MPI_IN_PLACE, got, (int)n, t, op, comm);
    } else {
        MPI_Allreduce(in, got, (int)n, t, op, comm);
    }
    char what[96];
    snprintf(what, sizeof what, "allreduce %s %s n=%ld%s", type_name(t), op_name(op), n,
             in_place ? " in place" : "");
    compare(what, t, got, want, n);
    free(in), free(got), free(want);
}

static void check_reduce(MPI_Datatype t, MPI_Op op, long n, int root)
{
    size_t bytes = (size_t)n * size_of(t);
    char *in = malloc(bytes), *got = malloc(bytes), *want = malloc(bytes);
    fill(t, in, n, rank);
    PMPI_Reduce(in, want, (int)n, t, op, root, MPI_COMM_WORLD);
    int in_place = rank == root && root % 2 == 1;
    if (in_place) {
        memcpy(got, in, bytes);
        MPI_Reduce(MPI_IN_PLACE, got, (int)n, t, op, root, MPI_COMM_WORLD);
    } else {
        MPI_Reduce(in, got, (int)n, t, op, root, MPI_COMM_WORLD);
    }
    if (rank == root) {
        char what[96];
        snprintf(what, sizeof what, "reduce %s %s n=%ld root=%d", type_name(t), op_name(op), n,
                 root);
        compare(what, t, got, want, n);
    }
    free(in), free(got), free(want);
}

static void check_reduce_scatter(MPI_Datatype t, MPI_Op op, long per_rank, int in_place)
{
    long n = per_rank * size;
    size_t bytes = (size_t)n * size_of(t);
    char *in = malloc(bytes), *got = malloc(bytes), *want = malloc(bytes);
    fill(t, in, n, rank);
    PMPI_Reduce_scatter_block(in, want, (int)per_rank, t, op, MPI_COMM_WORLD);
    if (in_place) {
        memcpy(got, in, bytes);
        MPI_Reduce_scatter_block(MPI_IN_PLACE, got, (int)per_rank, t, op, MPI_COMM_WORLD);
    } else {
        MPI_Reduce_scatter_block(in, got, (int)per_rank, t, op, MPI_COMM_WORLD);
    }
    char what[96];
    snprintf(what, sizeof what, "reduce_scatter_block %s %s per_rank=%ld%s", type_name(t),
             op_name(op), per_rank, in_place ? " in place" : "");
    compare(what, t, got, want, per_rank);
    free(in), free(got), free(want);
}

static void check_bcast(MPI_Datatype t, long n, int root)
{
    size_t bytes = (size_t)n * size_of(t);
    char *got = malloc(bytes), *want = malloc(bytes);
    fill(t, want, n, root);
    if (rank == root)
        memcpy(got, want, bytes);
    else
        memset(got, 0xa5, bytes);
    MPI_Bcast(got, (int)n, t, root, MPI_COMM_WORLD);
    char what[96];
    snprintf(what, sizeof what, "bcast %s n=%ld root=%d", type_name(t), n, root);
    if (memcmp(got, want, bytes) != 0)
        mismatch(what, 0, 0, 0);
    checks++;
    free(got), free(want);
}

static void check_allgather(MPI_Datatype t, long per_rank, int in_place)
{
    size_t part = (size_t)per_rank * size_of(t);
    char *mine = malloc(part), *got = malloc(part * (size_t)size), *want = malloc(part * (size_t)size);
    fill(t, mine, per_rank, rank);
    PMPI_Allgather(mine, (int)per_rank, t, want, (int)per_rank, t, MPI_COMM_WORLD);
    memset(got, 0x5a, part * (size_t)size);
    if (in_place) {
        memcpy(got + (size_t)rank * part, mine, part);
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, got, (int)per_rank, t, MPI_COMM_WORLD);
    } else {
        MPI_Allgather(mine, (int)per_rank, t, got, (int)per_rank, t, MPI_COMM_WORLD);
    }
    char what[96];
    snprintf(what, sizeof what, "allgather %s per_rank=%ld%s", type_name(t), per_rank,
             in_place ? " in place" : "");
    if (memcmp(got, want, part * (size_t)size) != 0)
        mismatch(what, 0, 0, 0);
    checks++;
    free(mine), free(got), free(want);
}

/* Sums that overflow int32 must wrap as MPI's do. */
static void check_overflow(void)
{
    enum { N = 1000 };
    int32_t in[N], got[N], want[N];
    for (int i = 0; i < N; i++)
        in[i] = i % 2 ? INT32_MAX - i : INT32_MIN + i;
    PMPI_Allreduce(in, want, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(in, got, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    compare("allreduce int sum overflowing", MPI_INT, got, want, N);
    memcpy(got, in, sizeof got);
    MPI_Allreduce(MPI_IN_PLACE, got, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    compare("allreduce int sum overflowing in place", MPI_INT, got, want, N);
    int32_t reduced[N];
    PMPI_Reduce(in, want, N, MPI_INT, MPI_SUM, size - 1, MPI_COMM_WORLD);
    memcpy(reduced, in, sizeof reduced);
    MPI_Reduce(rank == size - 1 ? MPI_IN_PLACE : in, reduced, N, MPI_INT, MPI_SUM, size - 1,
               MPI_COMM_WORLD);
    if (rank == size - 1)
        compare("reduce int sum overflowing in place", MPI_INT, reduced, want, N);
}

static void loop_allreduce(void)
{
    enum { N = 1000000 };
    int32_t *buf = malloc(N * sizeof *buf);
    for (long round = 0;; round++) {
        fill(MPI_INT, buf, N, rank);
        MPI_Allreduce(MPI_IN_PLACE, buf, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (round == 0 && rank == 0) {
            printf("xina-mpi-check: looping\n");
            fflush(stdout);
        }
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--thread-multiple") == 0) {
        int provided;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        if (provided != MPI_THREAD_MULTIPLE) {
            fprintf(stderr, "xina-mpi-check: this MPI gives no MPI_THREAD_MULTIPLE\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    } else {
        MPI_Init(&argc, &argv);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 1 && strcmp(argv[1], "--only-allreduce") == 0)
        loop_allreduce();

    const MPI_Datatype types[] = {MPI_INT, MPI_INT64_T, MPI_LONG, MPI_FLOAT};
    const MPI_Op ops[] = {MPI_SUM, MPI_MAX, MPI_MIN};
    /* 1 element, a packet's worth and one more (360 int32 or 180 int64 in
     * a 1,500-byte frame), and sizes that end mid-packet. */
    const long sizes[] = {1, 180, 181, 360, 361, 4097, 100003};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t o = 0; o < 3; o++) {
            if (types[t] == MPI_FLOAT && ops[o] != MPI_SUM)
                continue; /* passed on; checked below */
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
                check_allreduce(MPI_COMM_WORLD, types[t], ops[o], sizes[s], s % 2);
            for (int root = 0; root < size; root++)
                check_reduce(types[t], ops[o], root % 2 ? 361 : 1000, root);
            check_reduce_scatter(types[t], ops[o], 1, 0);
            check_reduce_scatter(types[t], ops[o], 1001, 1);
        }
    check_overflow();
    for (int root = 0; root < size; root++) {
        check_bcast(MPI_BYTE, root % 2 ? 1 : 100000, root);
        check_bcast(MPI_DOUBLE, 1441, root);
    }
    check_bcast(MPI_INT, 1 << 20, 0);
    check_allgather(MPI_BYTE, 1, 0);
    check_allgather(MPI_INT, 333, 1);
    check_allgather(MPI_DOUBLE, 5000, 0);
    for (int i = 0; i < 3; i++)
        MPI_Barrier(MPI_COMM_WORLD);

    /* Passed on to MPI: another type, another op, float max. */
    check_allreduce(MPI_COMM_WORLD, MPI_DOUBLE, MPI_SUM, 1000, 0);
    check_allreduce(MPI_COMM_WORLD, MPI_INT, MPI_PROD, 100, 0);
    check_allreduce(MPI_COMM_WORLD, MPI_FLOAT, MPI_MAX, 100, 0);
    /* A communicator of half the ranks: passed on. */
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    check_allreduce(half, MPI_INT, MPI_SUM, 1000, 0);
    MPI_Comm_free(&half);
    /* A duplicate of MPI_COMM_WORLD: through the switch, its own job. */
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    check_allreduce(dup, MPI_INT, MPI_SUM, 100003, 0);
    check_allreduce(dup, MPI_INT, MPI_SUM, 7, 1);
    MPI_Comm_free(&dup);

    long all = 0;
    PMPI_Reduce(&checks, &all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("xina-mpi-check: ok %ld\n", all);
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
