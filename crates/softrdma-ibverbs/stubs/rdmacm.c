/* softrdma stub of librdmacm.so.1: perftest uses the RDMA connection manager only with -R,
 * which needs the kernel's rdma_cm device; softrdma has none yet, so every call fails as
 * librdmacm does without one: NULL or -1 with errno ENODEV. Written for softrdma. */
#include <errno.h>
#include <stddef.h>

#define FAIL_PTR { errno = ENODEV; return NULL; }
#define FAIL_INT { errno = ENODEV; return -1; }

void *rdma_create_event_channel(void) FAIL_PTR
void rdma_destroy_event_channel(void *channel) { (void)channel; }
int rdma_create_id(void *channel, void **id, void *context, int ps) FAIL_INT
int rdma_destroy_id(void *id) FAIL_INT
int rdma_bind_addr(void *id, void *addr) FAIL_INT
int rdma_resolve_addr(void *id, void *src, void *dst, int timeout_ms) FAIL_INT
int rdma_resolve_route(void *id, int timeout_ms) FAIL_INT
int rdma_create_qp(void *id, void *pd, void *attr) FAIL_INT
int rdma_create_qp_ex(void *id, void *attr) FAIL_INT
void rdma_destroy_qp(void *id) { (void)id; }
int rdma_connect(void *id, void *param) FAIL_INT
int rdma_listen(void *id, int backlog) FAIL_INT
int rdma_accept(void *id, void *param) FAIL_INT
int rdma_reject(void *id, const void *data, unsigned char len) FAIL_INT
int rdma_disconnect(void *id) FAIL_INT
int rdma_get_cm_event(void *channel, void **event) FAIL_INT
int rdma_ack_cm_event(void *event) FAIL_INT
int rdma_set_option(void *id, int level, int optname, void *optval, size_t optlen) FAIL_INT
int rdma_getaddrinfo(const char *node, const char *service, const void *hints, void **res) FAIL_INT
void rdma_freeaddrinfo(void *res) { (void)res; }
const char *rdma_event_str(int event) { (void)event; return "RDMA_CM_EVENT_UNSUPPORTED"; }
