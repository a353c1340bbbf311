/* xina-mpi: MPI collectives through a xina switch, for unmodified MPI
 * programs (PMPI interposition: LD_PRELOAD=libxina_mpi.so, or link it in
 * before the MPI library).
 *
 * At MPI_Init, rank 0 asks the job service (XINA_SERVICE=http://a.b.c.d:port,
 * XINA_TOKEN) for the switch's address and broadcasts it. The first time a
 * communicator (MPI_COMM_WORLD, or one congruent to it, as MPI_Comm_dup
 * makes) runs a collective of a kind, its ranks bind UDP sockets, gather
 * their addresses with PMPI_Allgather, rank 0 leases a job (or a multicast
 * group) from the service, the answer is broadcast, and every rank makes
 * its member on its socket; the ranks agree before using it. Jobs are
 * released when the communicator is freed and at MPI_Finalize.
 *
 * Through the switch: MPI_Allreduce, MPI_Reduce (through an allreduce job),
 * MPI_Reduce_scatter_block, MPI_Barrier on int32 (MPI_INT, MPI_INT32_T),
 * int64 (MPI_INT64_T, MPI_LONG_LONG, MPI_LONG where 64-bit) with MPI_SUM,
 * MPI_MAX, MPI_MIN, and float (MPI_FLOAT) with MPI_SUM; MPI_Bcast and
 * MPI_Allgather of contiguous predefined types. MPI_IN_PLACE is taken.
 * Everything else goes to the PMPI_ function unchanged: other calls, types,
 * ops, communicators, one rank or more than 64, and everything when the
 * service is unset, unreachable, refuses, or has no room (said once on
 * stderr, counted). An integer sum that overflows is redone by PMPI from a
 * saved copy of the input, so results are MPI's. A failure inside a
 * collective (a rank gone, the switch unreachable) is MPI_ERR_OTHER through
 * the communicator's error handler, with xina's message on stderr.
 *
 * Under MPI_THREAD_MULTIPLE everything goes to PMPI (said once): a member
 * takes one call at a time.
 *
 * Environment: XINA_SERVICE, XINA_TOKEN (both needed to use the switch);
 * XINA_MPI_FLOAT=0 keeps float sums on MPI (MPI's exact order);
 * XINA_MPI_SLOTS (slots of each job, else the service's default);
 * XINA_MPI_GIVE_UP_MS (how long a call waits without progress, else the
 * library's 5 s); XINA_MPI_STATS=1 prints per-rank counts at MPI_Finalize;
 * XINA_MPI_VERBOSE=1 prints each job and group rank 0 leased.
 */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xina.h"

/* What a communicator's leased member is for. */
enum kind {
    KIND_JOB_BASE = 0, /* + 3 * op + dtype (0 int32, 1 int64, 2 unused) */
    KIND_RS_BASE = 9,  /* reduce-scatter jobs, likewise */
    KIND_GROUP = 18,
    KINDS = 19
};

enum state { UNTRIED = 0, READY = 1, FAILED = -1 };

struct member {
    enum state state;
    XinaWorker *worker;
    XinaGroup *group;
    XinaLease *lease; /* rank 0 only */
};

struct comm_state {
    struct member members[KINDS];
};

/* Counts of one kind of call. */
struct counts {
    long through, fallback;
};

enum call { C_ALLREDUCE, C_REDUCE, C_RS, C_BARRIER, C_BCAST, C_ALLGATHER, CALLS };
static const char *const CALL_NAMES[CALLS] = {
    "allreduce", "reduce", "reduce_scatter_block", "barrier", "bcast", "allgather",
};

static struct {
    int enabled;
    int keyval;
    char service[512];
    char token[512];
    char switch_addr[64];
    uint32_t ip;    /* this rank's address towards the switch, network order */
    uint8_t mac[6]; /* of the interface carrying it */
    int floats;
    unsigned slots;
    unsigned give_up_ms;
    int print_stats;
    int verbose;
    int said_fallback;
    struct counts counts[CALLS];
} xm = {.keyval = MPI_KEYVAL_INVALID};

/* Buffers kept from call to call, grown as needed, so that a collective
 * does not map and fault in fresh pages every time. */
static struct {
    void *p;
    size_t len;
} scratch[2];

static void *scratch_buf(int i, size_t bytes)
{
    if (scratch[i].len < bytes) {
        free(scratch[i].p);
        scratch[i].p = malloc(bytes);
        scratch[i].len = scratch[i].p != NULL ? bytes : 0;
    }
    return scratch[i].p;
}

static void say_fallback(const char *why)
{
    if (xm.said_fallback)
        return;
    xm.said_fallback = 1;
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "xina-mpi: rank %d: %s; such collectives run on MPI's own from now on\n", rank,
            why);
}

static unsigned env_unsigned(const char *name, unsigned dflt)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return dflt;
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    if (*end != '\0' || n > 1000000000UL) {
        fprintf(stderr, "xina-mpi: %s=%s is not a number; using %u\n", name, v, dflt);
        return dflt;
    }
    return (unsigned)n;
}

/* This host's address towards the switch, and its interface's MAC. */
static int local_address(const char *switch_addr)
{
    char host[64];
    snprintf(host, sizeof host, "%s", switch_addr);
    char *colon = strrchr(host, ':');
    if (colon == NULL)
        return -1;
    *colon = '\0';
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &to.sin_addr) != 1)
        return -1;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    int rc = connect(fd, (struct sockaddr *)&to, sizeof to);
    if (rc == 0)
        rc = getsockname(fd, (struct sockaddr *)&me, &len);
    close(fd);
    if (rc != 0)
        return -1;
    xm.ip = me.sin_addr.s_addr;

    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0)
        return -1;
    int found = -1;
    for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
            continue;
        if (((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr != xm.ip)
            continue;
        char path[128];
        snprintf(path, sizeof path, "/sys/class/net/%s/address", i->ifa_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            break;
        unsigned m[6];
        if (fscanf(f, "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) == 6) {
            for (int k = 0; k < 6; k++)
                xm.mac[k] = (uint8_t)m[k];
            found = 0;
        }
        fclose(f);
        break;
    }
    freeifaddrs(ifs);
    return found;
}

static int delete_state(MPI_Comm comm, int keyval, void *value, void *extra);

/* After PMPI_Init (at thread level `threads`): learn the switch's address
 * from the service (rank 0), share it and whether to go on. */
static void setup(int threads)
{
    const char *service = getenv("XINA_SERVICE");
    const char *token = getenv("XINA_TOKEN");
    int rank = 0, size = 1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    xm.floats = env_unsigned("XINA_MPI_FLOAT", 1) != 0;
    xm.slots = env_unsigned("XINA_MPI_SLOTS", 0);
    xm.give_up_ms = env_unsigned("XINA_MPI_GIVE_UP_MS", 0);
    xm.print_stats = env_unsigned("XINA_MPI_STATS", 0) != 0;
    xm.verbose = env_unsigned("XINA_MPI_VERBOSE", 0) != 0;
    if (service == NULL || token == NULL || *service == '\0') {
        /* Not asked to: every rank sees the same environment under mpirun;
         * an uneven one is caught by the agreement below. */
        xm.said_fallback = 1;
    } else {
        snprintf(xm.service, sizeof xm.service, "%s", service);
        snprintf(xm.token, sizeof xm.token, "%s", token);
    }
    if (threads == MPI_THREAD_MULTIPLE && xm.service[0] != '\0') {
        /* A member takes one call at a time, and which thread's call a
         * switch job would serve is not known. */
        if (rank == 0)
            say_fallback("MPI_THREAD_MULTIPLE: the xina library takes collectives from one thread "
                         "at a time");
        xm.said_fallback = 1;
        xm.service[0] = '\0';
    }
    char answer[64] = {0};
    if (rank == 0 && xm.service[0] != '\0') {
        if (xina_service_switch(xm.service, xm.token, answer, sizeof answer) != XINA_STATUS_OK) {
            char why[700];
            snprintf(why, sizeof why, "no xina switch (%s)", xina_last_error());
            say_fallback(why);
            answer[0] = '\0';
        }
    }
    PMPI_Bcast(answer, sizeof answer, MPI_CHAR, 0, MPI_COMM_WORLD);
    int ok = answer[0] != '\0' && xm.service[0] != '\0';
    if (ok) {
        snprintf(xm.switch_addr, sizeof xm.switch_addr, "%s", answer);
        if (local_address(xm.switch_addr) != 0) {
            say_fallback("cannot find this host's address and MAC towards the switch");
            ok = 0;
        }
    }
    int all = 0;
    PMPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    xm.enabled = all && size >= 2 && size <= 64;
    if (xm.enabled)
        PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_state, &xm.keyval, NULL);
}

int MPI_Init(int *argc, char ***argv)
{
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS)
        setup(MPI_THREAD_SINGLE);
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS)
        setup(*provided);
    return rc;
}

static void release(struct member *m)
{
    if (m->worker != NULL)
        xina_worker_free(m->worker);
    if (m->group != NULL)
        xina_group_free(m->group);
    if (m->lease != NULL && xina_lease_free(m->lease) != XINA_STATUS_OK)
        fprintf(stderr, "xina-mpi: releasing a job: %s\n", xina_last_error());
    *m = (struct member){0};
}

static int delete_state(MPI_Comm comm, int keyval, void *value, void *extra)
{
    (void)comm, (void)keyval, (void)extra;
    struct comm_state *s = value;
    for (int k = 0; k < KINDS; k++)
        release(&s->members[k]);
    free(s);
    return MPI_SUCCESS;
}

int MPI_Finalize(void)
{
    if (xm.enabled) {
        PMPI_Comm_delete_attr(MPI_COMM_WORLD, xm.keyval);
        PMPI_Comm_free_keyval(&xm.keyval);
    }
    for (int i = 0; i < 2; i++) {
        free(scratch[i].p);
        scratch[i].p = NULL;
        scratch[i].len = 0;
    }
    if (xm.print_stats) {
        int rank = 0;
        PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
        /* One write, so that ranks' lines do not interleave. */
        char line[512];
        size_t at = (size_t)snprintf(line, sizeof line, "xina-mpi: rank %d:", rank);
        for (int c = 0; c < CALLS && at < sizeof line; c++)
            at += (size_t)snprintf(line + at, sizeof line - at, " %s %ld/%ld", CALL_NAMES[c],
                                   xm.counts[c].through,
                                   xm.counts[c].through + xm.counts[c].fallback);
        fprintf(stderr, "%s (through the switch/all)\n", line);
    }
    return PMPI_Finalize();
}

/* The state of `comm`, made on first use; NULL for a communicator that is
 * not MPI_COMM_WORLD or congruent to it. */
static struct comm_state *state_of(MPI_Comm comm)
{
    if (!xm.enabled)
        return NULL;
    struct comm_state *s;
    int found = 0;
    PMPI_Comm_get_attr(comm, xm.keyval, &s, &found);
    if (found)
        return s;
    int cmp;
    PMPI_Comm_compare(comm, MPI_COMM_WORLD, &cmp);
    if (cmp != MPI_IDENT && cmp != MPI_CONGRUENT)
        return NULL; /* and MPI_COMM_WORLD has 2 to 64 ranks, or xm.enabled is 0 */
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    PMPI_Comm_set_attr(comm, xm.keyval, s);
    return s;
}

/* What the ranks exchange to make a job. */
struct address {
    uint32_t ip; /* network order */
    uint16_t port;
    uint8_t mac[6];
};

/* What rank 0 broadcasts: the leased job's parameters. */
struct leased {
    int32_t ok;
    uint32_t id, slots_or_window, op, elem_type, mode;
    uint16_t elems_or_bytes;
    uint8_t fan_in;
};

static const char *const OP_NAMES[3] = {"sum", "max", "min"};

/* The request of `kind` for `size` ranks at `addrs`, into `buf`. */
static int request_json(char *buf, size_t len, int kind, const struct address *addrs, int size)
{
    size_t at = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int n = snprintf(buf + at, at < len ? len - at : 0, __VA_ARGS__);                          \
        if (n < 0)                                                                                 \
            return -1;                                                                             \
        at += (size_t)n;                                                                           \
    } while (0)
    if (kind == KIND_GROUP) {
        PUT("{\"mode\":\"multicast\"");
    } else {
        int rs = kind >= KIND_RS_BASE;
        int k = kind - (rs ? KIND_RS_BASE : KIND_JOB_BASE);
        PUT("{\"mode\":\"%s\",\"op\":\"%s\",\"dtype\":\"%s\"", rs ? "reduce-scatter" : "allreduce",
            OP_NAMES[k / 3], k % 3 == 1 ? "i64" : "i32");
        if (xm.slots > 0)
            PUT(",\"slots\":%u", xm.slots);
    }
    PUT(",\"members\":[");
    for (int r = 0; r < size; r++) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &addrs[r].ip, ip, sizeof ip);
        const uint8_t *m = addrs[r].mac;
        PUT("%s{\"ip\":\"%s\",\"port\":%u,\"mac\":\"%02x:%02x:%02x:%02x:%02x:%02x\"%s}",
            r ? "," : "", ip, ntohs(addrs[r].port), m[0], m[1], m[2], m[3], m[4], m[5],
            kind == KIND_GROUP ? ",\"sender\":true" : "");
    }
    PUT("]}");
#undef PUT
    return at < len ? 0 : -1;
}

/* Makes `comm`'s member of `kind` (collective over `comm`); whether every
 * rank has it. */
static int make_member(MPI_Comm comm, struct member *m, int kind)
{
    int rank, size;
    PMPI_Comm_rank(comm, &rank);
    PMPI_Comm_size(comm, &size);
    char why[900] = "";

    struct address me = {.ip = xm.ip};
    memcpy(me.mac, xm.mac, 6);
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = xm.ip};
    socklen_t len = sizeof at;
    if (fd < 0 || bind(fd, (struct sockaddr *)&at, sizeof at) != 0 ||
        getsockname(fd, (struct sockaddr *)&at, &len) != 0) {
        snprintf(why, sizeof why, "binding a UDP socket: %s", strerror(errno));
        me.ip = 0;
    }
    me.port = at.sin_port;

    struct address addrs[64]; /* state_of() takes no more ranks */
    PMPI_Allgather(&me, sizeof me, MPI_BYTE, addrs, sizeof me, MPI_BYTE, comm);

    struct leased l = {0};
    if (rank == 0) {
        int complete = 1;
        for (int r = 0; complete && r < size; r++)
            complete = addrs[r].ip != 0;
        char body[8192];
        if (!complete) {
            snprintf(why, sizeof why, "a rank could not bind its socket");
        } else if (request_json(body, sizeof body, kind, addrs, size) != 0) {
            snprintf(why, sizeof why, "the job request does not fit its buffer");
        } else if (xina_lease_new(xm.service, xm.token, body, &m->lease) != XINA_STATUS_OK) {
            snprintf(why, sizeof why, "%s", xina_last_error());
        } else if (kind == KIND_GROUP) {
            XinaGroupParams p;
            if (xina_lease_group_params(m->lease, &p) == XINA_STATUS_OK)
                l = (struct leased){.ok = 1, .id = p.group, .slots_or_window = p.window,
                                    .elems_or_bytes = p.bytes_per_packet, .fan_in = p.fan_in};
            else
                snprintf(why, sizeof why, "%s", xina_last_error());
        } else {
            XinaJobParams p;
            if (xina_lease_job_params(m->lease, &p) == XINA_STATUS_OK)
                l = (struct leased){.ok = 1, .id = p.job, .slots_or_window = p.slots, .op = p.op,
                                    .elem_type = p.elem_type, .mode = p.mode,
                                    .elems_or_bytes = p.elems_per_packet, .fan_in = p.fan_in};
            else
                snprintf(why, sizeof why, "%s", xina_last_error());
        }
    }
    PMPI_Bcast(&l, sizeof l, MPI_BYTE, 0, comm);

    int ok = l.ok && fd >= 0 && me.ip != 0;
    if (ok && kind == KIND_GROUP) {
        XinaGroupParams p = {.group = l.id, .rank = (uint8_t)rank, .fan_in = l.fan_in,
                             .bytes_per_packet = l.elems_or_bytes, .window = l.slots_or_window,
                             .switch_addr = xm.switch_addr, .give_up_ms = xm.give_up_ms};
        ok = xina_group_adopt(&p, fd, &m->group) == XINA_STATUS_OK;
        fd = -1;
    } else if (ok) {
        XinaJobParams p = {.job = l.id, .rank = (uint8_t)rank, .fan_in = l.fan_in,
                           .elems_per_packet = l.elems_or_bytes, .slots = l.slots_or_window,
                           .op = l.op, .elem_type = l.elem_type, .mode = l.mode,
                           .switch_addr = xm.switch_addr, .give_up_ms = xm.give_up_ms};
        ok = xina_worker_adopt(&p, fd, &m->worker) == XINA_STATUS_OK;
        fd = -1;
    }
    if (!ok && why[0] == '\0' && l.ok)
        snprintf(why, sizeof why, "%s", xina_last_error());
    if (fd >= 0)
        close(fd);
    int all = 0;
    PMPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
    if (!all) {
        if (why[0] != '\0')
            say_fallback(why);
        release(m);
        m->state = FAILED;
        return 0;
    }
    m->state = READY;
    if (xm.verbose && rank == 0)
        fprintf(stderr,
                "xina-mpi: %s %u of %u ranks: %u %s per packet, %s %u\n",
                kind == KIND_GROUP ? "group" : "job", l.id, l.fan_in, l.elems_or_bytes,
                kind == KIND_GROUP ? "bytes" : "elements", kind == KIND_GROUP ? "window" : "slots",
                l.slots_or_window);
    return 1;
}

/* `comm`'s member of `kind`, made on first use; NULL: use PMPI. */
static struct member *member_of(MPI_Comm comm, int kind)
{
    struct comm_state *s = state_of(comm);
    if (s == NULL)
        return NULL;
    struct member *m = &s->members[kind];
    if (m->state == UNTRIED)
        make_member(comm, m, kind);
    return m->state == READY ? m : NULL;
}

/* A type the switch combines: 0 int32, 1 int64, 2 float32; -1 none. */
static int switch_type(MPI_Datatype t)
{
    if (t == MPI_INT || t == MPI_INT32_T)
        return 0;
    if (t == MPI_INT64_T || t == MPI_LONG_LONG || (t == MPI_LONG && sizeof(long) == 8))
        return 1;
    if (t == MPI_FLOAT)
        return xm.floats ? 2 : -1;
    return -1;
}

static int switch_op(MPI_Op op)
{
    return op == MPI_SUM ? 0 : op == MPI_MAX ? 1 : op == MPI_MIN ? 2 : -1;
}

/* The job kind for `type` and `op` (float sums ride on int32 sum jobs),
 * from `base`; -1 if the switch does not take them. */
static int job_kind(int base, MPI_Datatype type, MPI_Op op, int *xtype)
{
    int t = switch_type(type), o = switch_op(op);
    if (t < 0 || o < 0 || (t == 2 && o != 0))
        return -1;
    *xtype = t == 2 ? XINA_TYPE_FLOAT32 : t == 1 ? XINA_TYPE_INT64 : XINA_TYPE_INT32;
    return base + 3 * o + (t == 1 ? 1 : 0);
}

static size_t type_size(int xtype)
{
    return xtype == XINA_TYPE_INT64 ? 8 : 4;
}

/* A failure inside a collective: xina's message, then the error handler. */
static int failed(MPI_Comm comm, const char *what)
{
    int rank = 0;
    PMPI_Comm_rank(comm, &rank);
    fprintf(stderr, "xina-mpi: rank %d: %s through the switch: %s\n", rank, what,
            xina_last_error());
    PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
}

/* Memory for a copy was short on this rank: an error (the other ranks,
 * already in the collective, give up and report theirs). */
static int no_memory(MPI_Comm comm, const char *what)
{
    int rank = 0;
    PMPI_Comm_rank(comm, &rank);
    fprintf(stderr, "xina-mpi: rank %d: %s: no memory for a copy of the data\n", rank, what);
    PMPI_Comm_call_errhandler(comm, MPI_ERR_NO_MEM);
    return MPI_ERR_NO_MEM;
}

/* Combines `count` elements over `comm`, all ranks getting the result in
 * `data`: from `input` (out of place, no copy) or, with `input` NULL, from
 * `data` in place. An integer sum that overflows is redone by PMPI from
 * its input, which survives in `input` or, in place, in a copy kept here. */
static int combine(struct member *m, MPI_Comm comm, const void *input, void *data, int count,
                   MPI_Datatype type, MPI_Op op, int xtype, const char *what)
{
    size_t n = (size_t)count;
    const void *saved = input;
    if (input == NULL && op == MPI_SUM && xtype != XINA_TYPE_FLOAT32) {
        size_t bytes = n * type_size(xtype);
        void *copy = scratch_buf(1, bytes);
        if (copy == NULL)
            return no_memory(comm, what);
        saved = memcpy(copy, data, bytes);
    }
    XinaStatus st = input != NULL
                        ? xina_allreduce_from(m->worker, input, data, n, (uint32_t)xtype)
                        : xina_allreduce(m->worker, data, n, (uint32_t)xtype);
    if (st == XINA_STATUS_OVERFLOW && saved != NULL)
        return PMPI_Allreduce(saved, data, count, type, op, comm);
    if (st != XINA_STATUS_OK)
        return failed(comm, what);
    return MPI_SUCCESS;
}

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
                  MPI_Comm comm)
{
    int xtype, kind = job_kind(KIND_JOB_BASE, type, op, &xtype);
    struct member *m = count > 0 && kind >= 0 ? member_of(comm, kind) : NULL;
    if (m == NULL) {
        xm.counts[C_ALLREDUCE].fallback++;
        return PMPI_Allreduce(sendbuf, recvbuf, count, type, op, comm);
    }
    xm.counts[C_ALLREDUCE].through++;
    return combine(m, comm, sendbuf == MPI_IN_PLACE ? NULL : sendbuf, recvbuf, count, type, op,
                   xtype, "allreduce");
}

int MPI_Reduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
               int root, MPI_Comm comm)
{
    int rank = 0;
    int xtype, kind = job_kind(KIND_JOB_BASE, type, op, &xtype);
    struct member *m = count > 0 && kind >= 0 ? member_of(comm, kind) : NULL;
    if (m == NULL) {
        xm.counts[C_REDUCE].fallback++;
        return PMPI_Reduce(sendbuf, recvbuf, count, type, op, root, comm);
    }
    PMPI_Comm_rank(comm, &rank);
    /* Every rank gets the result from the switch's copies; only the root
     * keeps it. */
    void *data = rank == root ? recvbuf : scratch_buf(0, (size_t)count * type_size(xtype));
    if (data == NULL)
        return no_memory(comm, "reduce");
    const void *input = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
    xm.counts[C_REDUCE].through++;
    return combine(m, comm, data != input ? input : NULL, data, count, type, op, xtype, "reduce");
}

int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount, MPI_Datatype type,
                             MPI_Op op, MPI_Comm comm)
{
    int rank = 0, size = 1;
    int xtype, kind = job_kind(KIND_RS_BASE, type, op, &xtype);
    struct member *m = recvcount > 0 && kind >= 0 ? member_of(comm, kind) : NULL;
    if (m == NULL) {
        xm.counts[C_RS].fallback++;
        return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, type, op, comm);
    }
    PMPI_Comm_rank(comm, &rank);
    PMPI_Comm_size(comm, &size);
    size_t part = (size_t)recvcount * type_size(xtype), bytes = part * (size_t)size;
    const void *input = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
    void *data = scratch_buf(0, bytes);
    if (data == NULL)
        return no_memory(comm, "reduce_scatter_block");
    memcpy(data, input, bytes);
    xm.counts[C_RS].through++;
    XinaStatus st = xina_reduce_scatter(m->worker, data, (size_t)recvcount * (size_t)size,
                                        (uint32_t)xtype);
    if (st == XINA_STATUS_OVERFLOW) /* an integer sum: the input is intact, MPI's result */
        return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, type, op, comm);
    if (st != XINA_STATUS_OK)
        return failed(comm, "reduce-scatter");
    memcpy(recvbuf, (char *)data + (size_t)rank * part, part);
    return MPI_SUCCESS;
}

int MPI_Barrier(MPI_Comm comm)
{
    int xtype, kind = job_kind(KIND_JOB_BASE, MPI_INT, MPI_SUM, &xtype);
    struct member *m = member_of(comm, kind);
    if (m == NULL) {
        xm.counts[C_BARRIER].fallback++;
        return PMPI_Barrier(comm);
    }
    xm.counts[C_BARRIER].through++;
    if (xina_barrier(m->worker) != XINA_STATUS_OK)
        return failed(comm, "barrier");
    return MPI_SUCCESS;
}

/* Bytes of `count` elements of a predefined contiguous type; 0 otherwise. */
static size_t plain_bytes(MPI_Datatype t, int count)
{
    static const MPI_Datatype plain[] = {
        MPI_BYTE,      MPI_CHAR,          MPI_SIGNED_CHAR, MPI_UNSIGNED_CHAR, MPI_SHORT,
        MPI_UNSIGNED_SHORT, MPI_INT,      MPI_UNSIGNED,    MPI_LONG,          MPI_UNSIGNED_LONG,
        MPI_LONG_LONG, MPI_UNSIGNED_LONG_LONG, MPI_FLOAT,  MPI_DOUBLE,        MPI_INT8_T,
        MPI_INT16_T,   MPI_INT32_T,       MPI_INT64_T,     MPI_UINT8_T,       MPI_UINT16_T,
        MPI_UINT32_T,  MPI_UINT64_T,
    };
    if (count <= 0)
        return 0;
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        if (t == plain[i]) {
            int size;
            PMPI_Type_size(t, &size);
            return (size_t)size * (size_t)count;
        }
    }
    return 0;
}

int MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm)
{
    size_t bytes = plain_bytes(type, count);
    struct member *m = bytes > 0 && root >= 0 && root < 64 ? member_of(comm, KIND_GROUP) : NULL;
    if (m == NULL) {
        xm.counts[C_BCAST].fallback++;
        return PMPI_Bcast(buf, count, type, root, comm);
    }
    xm.counts[C_BCAST].through++;
    if (xina_broadcast(m->group, (uint8_t)root, buf, bytes) != XINA_STATUS_OK)
        return failed(comm, "broadcast");
    return MPI_SUCCESS;
}

int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm)
{
    size_t part = plain_bytes(recvtype, recvcount);
    int same = sendbuf == MPI_IN_PLACE || (sendtype == recvtype && sendcount == recvcount);
    struct member *m = part > 0 && same ? member_of(comm, KIND_GROUP) : NULL;
    if (m == NULL) {
        xm.counts[C_ALLGATHER].fallback++;
        return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    }
    int rank, size;
    PMPI_Comm_rank(comm, &rank);
    PMPI_Comm_size(comm, &size);
    if (sendbuf != MPI_IN_PLACE)
        memcpy((char *)recvbuf + (size_t)rank * part, sendbuf, part);
    xm.counts[C_ALLGATHER].through++;
    if (xina_allgather(m->group, recvbuf, part * (size_t)size) != XINA_STATUS_OK)
        return failed(comm, "allgather");
    return MPI_SUCCESS;
}
