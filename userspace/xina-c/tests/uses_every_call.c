/* Uses every declaration of xina.h, so that the header test compiles and
 * links all of them; run without a switch, each call fails cleanly. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include "xina.h"

/* A UDP socket bound to a free loopback port, as a rank binds before the
 * job service leases its job. */
static int bound_socket(void) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&at, sizeof at) != 0) {
        perror("binding a UDP socket");
        exit(EXIT_FAILURE);
    }
    return fd;
}

static int expect(XinaStatus got, XinaStatus want, const char *what) {
    printf("%s: %s (%s)\n", what, xina_status_name((uint32_t)got), xina_last_error());
    if (got != want) {
        fprintf(stderr, "%s: expected %s\n", what, xina_status_name((uint32_t)want));
        return 1;
    }
    return 0;
}

int main(void) {
    int failed = 0;
    XinaWorker *worker = NULL;
    XinaGroup *group = NULL;
    XinaStats last, total;
    char addr[32];
    int32_t data[4] = {1, 2, 3, 4};

    /* The environment names no switch here. */
    failed |= expect(xina_worker_from_env(&worker), XINA_STATUS_INVALID_ARGUMENT, "from_env");

    XinaJobParams params = {
        .job = 1, .rank = 0, .fan_in = 2, .elems_per_packet = 4, .slots = 4,
        .op = XINA_OP_SUM, .elem_type = XINA_TYPE_INT32, .mode = XINA_MODE_ALLREDUCE,
        .switch_addr = "127.0.0.1:9", .bind_addr = "127.0.0.1:0", .give_up_ms = 100,
    };
    failed |= expect(xina_worker_new(&params, &worker), XINA_STATUS_OK, "worker_new");
    failed |= expect(xina_worker_local_addr(worker, addr, sizeof addr), XINA_STATUS_OK, "local_addr");
    failed |= expect(xina_allreduce(worker, data, 4, XINA_TYPE_INT32), XINA_STATUS_GAVE_UP, "allreduce");
    int32_t out[4];
    failed |= expect(xina_allreduce_from(worker, data, out, 4, XINA_TYPE_INT32), XINA_STATUS_GAVE_UP, "allreduce_from");
    failed |= expect(xina_reduce(worker, 0, data, 4, XINA_TYPE_INT32), XINA_STATUS_INVALID_ARGUMENT, "reduce");
    failed |= expect(xina_reduce_scatter(worker, data, 4, XINA_TYPE_INT32), XINA_STATUS_INVALID_ARGUMENT,
                     "reduce_scatter");
    failed |= expect(xina_barrier(worker), XINA_STATUS_GAVE_UP, "barrier");
    failed |= expect(xina_worker_stats(worker, &last, &total), XINA_STATUS_OK, "worker_stats");
    xina_worker_free(worker);

    XinaGroupParams gp = {
        .group = 2, .rank = 0, .fan_in = 2, .bytes_per_packet = 64, .window = 4,
        .switch_addr = "127.0.0.1:9", .bind_addr = NULL, .give_up_ms = 100,
    };
    failed |= expect(xina_group_new(&gp, &group), XINA_STATUS_OK, "group_new");
    failed |= expect(xina_broadcast(group, 0, data, sizeof data), XINA_STATUS_GROUP_STALLED, "broadcast");
    failed |= expect(xina_allgather(group, data, sizeof data), XINA_STATUS_GROUP_STALLED, "allgather");
    failed |= expect(xina_group_stats(group, &last, NULL), XINA_STATUS_OK, "group_stats");
    xina_group_free(group);

    /* Members on sockets bound before the job existed. */
    failed |= expect(xina_worker_adopt(&params, -1, &worker), XINA_STATUS_INVALID_ARGUMENT, "worker_adopt -1");
    failed |= expect(xina_worker_adopt(&params, bound_socket(), &worker), XINA_STATUS_OK, "worker_adopt");
    failed |= expect(xina_allreduce(worker, data, 4, XINA_TYPE_INT32), XINA_STATUS_GAVE_UP, "adopted allreduce");
    xina_worker_free(worker);
    failed |= expect(xina_group_adopt(&gp, bound_socket(), &group), XINA_STATUS_OK, "group_adopt");
    xina_group_free(group);

    /* No job service listens on the discard port. */
    XinaLease *lease = NULL;
    failed |= expect(xina_service_switch("http://127.0.0.1:9", "a-token-of-16-chars", addr, sizeof addr),
                     XINA_STATUS_REFUSED, "service_switch");
    failed |= expect(xina_lease_new("http://127.0.0.1:9", "a-token-of-16-chars", "{\"members\": []}", &lease),
                     XINA_STATUS_REFUSED, "lease_new");
    failed |= expect(xina_lease_job_params(lease, &params), XINA_STATUS_NULL_POINTER, "lease_job_params");
    failed |= expect(xina_lease_group_params(lease, &gp), XINA_STATUS_NULL_POINTER, "lease_group_params");
    failed |= expect(xina_lease_free(lease), XINA_STATUS_OK, "lease_free NULL");
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
