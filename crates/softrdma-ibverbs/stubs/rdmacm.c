/* softrdma's librdmacm.so.1: every symbol and version node of rdma-core 44's librdmacm.
 *
 * The RDMA connection manager itself lives in softrdma's libibverbs.so.1 (src/rdmacm/), beside
 * the verbs objects its ids use; this library gives librdmacm's names and version nodes to the
 * calls and forwards each through the table softrdma_rdmacm_ops() returns (the struct below
 * mirrors src/rdmacm/ops.rs field for field). Not supported, with a clear errno: multicast
 * (EOPNOTSUPP), ECE (EOPNOTSUPP), rsockets (ENOSYS; rpoll and rselect pass through to poll
 * and select, rclose to close, since no rsocket can exist). Written for softrdma. */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

struct ops {
	uint32_t version;
	void *(*create_event_channel)(void);
	void (*destroy_event_channel)(void *);
	int (*create_id)(void *, void **, void *, int);
	int (*destroy_id)(void *);
	int (*bind_addr)(void *, void *);
	int (*resolve_addr)(void *, void *, void *, int);
	int (*resolve_route)(void *, int);
	int (*create_qp)(void *, void *, void *);
	int (*create_qp_ex)(void *, void *);
	void (*destroy_qp)(void *);
	int (*connect)(void *, void *);
	int (*listen)(void *, int);
	int (*accept)(void *, void *);
	int (*reject)(void *, const void *, uint8_t);
	int (*disconnect)(void *);
	int (*get_cm_event)(void *, void **);
	int (*ack_cm_event)(void *);
	int (*set_option)(void *, int, int, void *, size_t);
	int (*migrate_id)(void *, void *);
	int (*get_request)(void *, void **);
	int (*create_ep)(void **, void *, void *, void *);
	void (*destroy_ep)(void *);
	int (*establish)(void *);
	int (*init_qp_attr)(void *, void *, int *);
	int (*create_srq)(void *, void *, void *);
	void (*destroy_srq)(void *);
	void **(*get_devices)(int *);
	void (*free_devices)(void **);
	int (*getaddrinfo)(const char *, const char *, const void *, void **);
	void (*freeaddrinfo)(void *);
	const char *(*event_str)(int);
	uint16_t (*get_src_port)(void *);
	uint16_t (*get_dst_port)(void *);
};

#define OPS_VERSION 1

extern const struct ops *softrdma_rdmacm_ops(void);

static const struct ops *O(void)
{
	static const struct ops *o;
	if (!o) {
		const struct ops *t = softrdma_rdmacm_ops();
		if (!t || t->version != OPS_VERSION) {
			fprintf(stderr, "librdmacm.so.1 (softrdma): libibverbs.so.1 is not the matching softrdma library\n");
			abort();
		}
		o = t;
	}
	return o;
}

#define FAIL(e) do { errno = (e); return -1; } while (0)

void *rdma_create_event_channel(void) { return O()->create_event_channel(); }
void rdma_destroy_event_channel(void *ch) { O()->destroy_event_channel(ch); }
int rdma_create_id(void *ch, void **id, void *ctx, int ps) { return O()->create_id(ch, id, ctx, ps); }
int rdma_create_ep(void **id, void *res, void *pd, void *attr) { return O()->create_ep(id, res, pd, attr); }
void rdma_destroy_ep(void *id) { O()->destroy_ep(id); }
int rdma_destroy_id(void *id) { return O()->destroy_id(id); }
int rdma_bind_addr(void *id, void *addr) { return O()->bind_addr(id, addr); }
int rdma_resolve_addr(void *id, void *src, void *dst, int ms) { return O()->resolve_addr(id, src, dst, ms); }
int rdma_resolve_route(void *id, int ms) { return O()->resolve_route(id, ms); }
int rdma_create_qp(void *id, void *pd, void *attr) { return O()->create_qp(id, pd, attr); }
int rdma_create_qp_ex(void *id, void *attr) { return O()->create_qp_ex(id, attr); }
void rdma_destroy_qp(void *id) { O()->destroy_qp(id); }
int rdma_connect(void *id, void *param) { return O()->connect(id, param); }
int rdma_listen(void *id, int backlog) { return O()->listen(id, backlog); }
int rdma_accept(void *id, void *param) { return O()->accept(id, param); }
int rdma_reject(void *id, const void *data, uint8_t len) { return O()->reject(id, data, len); }
int rdma_reject_ece(void *id, const void *data, uint8_t len) { return O()->reject(id, data, len); }
int rdma_notify(void *id, int event) { (void)id; (void)event; return 0; }
int rdma_disconnect(void *id) { return O()->disconnect(id); }
int rdma_get_request(void *listen, void **id) { return O()->get_request(listen, id); }
int rdma_get_cm_event(void *ch, void **ev) { return O()->get_cm_event(ch, ev); }
int rdma_ack_cm_event(void *ev) { return O()->ack_cm_event(ev); }
const char *rdma_event_str(int event) { return O()->event_str(event); }
int rdma_set_option(void *id, int level, int name, void *val, size_t len) { return O()->set_option(id, level, name, val, len); }
int rdma_migrate_id(void *id, void *ch) { return O()->migrate_id(id, ch); }
int rdma_getaddrinfo(const char *node, const char *service, const void *hints, void **res) { return O()->getaddrinfo(node, service, hints, res); }
void rdma_freeaddrinfo(void *res) { O()->freeaddrinfo(res); }
void **rdma_get_devices(int *num) { return O()->get_devices(num); }
void rdma_free_devices(void **list) { O()->free_devices(list); }
uint16_t rdma_get_src_port(void *id) { return O()->get_src_port(id); }
uint16_t rdma_get_dst_port(void *id) { return O()->get_dst_port(id); }
int rdma_create_srq(void *id, void *pd, void *attr) { return O()->create_srq(id, pd, attr); }
int rdma_create_srq_ex(void *id, void *attr) { (void)id; (void)attr; FAIL(EOPNOTSUPP); }
void rdma_destroy_srq(void *id) { O()->destroy_srq(id); }
int rdma_establish(void *id) { return O()->establish(id); }
int rdma_init_qp_attr(void *id, void *attr, int *mask) { return O()->init_qp_attr(id, attr, mask); }

int rdma_join_multicast(void *id, void *addr, void *ctx) { (void)id; (void)addr; (void)ctx; FAIL(EOPNOTSUPP); }
int rdma_join_multicast_ex(void *id, void *attr, void *ctx) { (void)id; (void)attr; (void)ctx; FAIL(EOPNOTSUPP); }
int rdma_leave_multicast(void *id, void *addr) { (void)id; (void)addr; FAIL(EOPNOTSUPP); }
int rdma_get_remote_ece(void *id, void *ece) { (void)id; (void)ece; FAIL(EOPNOTSUPP); }
int rdma_set_local_ece(void *id, void *ece) { (void)id; (void)ece; FAIL(EOPNOTSUPP); }

/* rsockets: not provided. No rsocket can be created, so the calls that may be given ordinary
 * descriptors pass through. */
int rpoll(struct pollfd *fds, nfds_t nfds, int timeout) { return poll(fds, nfds, timeout); }
int rselect(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *t) { return select(n, r, w, e, t); }
int rclose(int fd) { return close(fd); }
int rsocket(int d, int t, int p) { (void)d; (void)t; (void)p; FAIL(ENOSYS); }
int rbind(int s, const void *a, socklen_t l) { (void)s; (void)a; (void)l; FAIL(ENOSYS); }
int rlisten(int s, int b) { (void)s; (void)b; FAIL(ENOSYS); }
int raccept(int s, void *a, socklen_t *l) { (void)s; (void)a; (void)l; FAIL(ENOSYS); }
int rconnect(int s, const void *a, socklen_t l) { (void)s; (void)a; (void)l; FAIL(ENOSYS); }
int rshutdown(int s, int h) { (void)s; (void)h; FAIL(ENOSYS); }
ssize_t rrecv(int s, void *b, size_t l, int f) { (void)s; (void)b; (void)l; (void)f; FAIL(ENOSYS); }
ssize_t rrecvfrom(int s, void *b, size_t l, int f, void *a, socklen_t *al) { (void)s; (void)b; (void)l; (void)f; (void)a; (void)al; FAIL(ENOSYS); }
ssize_t rrecvmsg(int s, void *m, int f) { (void)s; (void)m; (void)f; FAIL(ENOSYS); }
ssize_t rsend(int s, const void *b, size_t l, int f) { (void)s; (void)b; (void)l; (void)f; FAIL(ENOSYS); }
ssize_t rsendto(int s, const void *b, size_t l, int f, const void *a, socklen_t al) { (void)s; (void)b; (void)l; (void)f; (void)a; (void)al; FAIL(ENOSYS); }
ssize_t rsendmsg(int s, const void *m, int f) { (void)s; (void)m; (void)f; FAIL(ENOSYS); }
ssize_t rread(int s, void *b, size_t c) { (void)s; (void)b; (void)c; FAIL(ENOSYS); }
ssize_t rreadv(int s, const struct iovec *v, int c) { (void)s; (void)v; (void)c; FAIL(ENOSYS); }
ssize_t rwrite(int s, const void *b, size_t c) { (void)s; (void)b; (void)c; FAIL(ENOSYS); }
ssize_t rwritev(int s, const struct iovec *v, int c) { (void)s; (void)v; (void)c; FAIL(ENOSYS); }
int rgetpeername(int s, void *a, socklen_t *l) { (void)s; (void)a; (void)l; FAIL(ENOSYS); }
int rgetsockname(int s, void *a, socklen_t *l) { (void)s; (void)a; (void)l; FAIL(ENOSYS); }
int rsetsockopt(int s, int lv, int n, const void *v, socklen_t l) { (void)s; (void)lv; (void)n; (void)v; (void)l; FAIL(ENOSYS); }
int rgetsockopt(int s, int lv, int n, void *v, socklen_t *l) { (void)s; (void)lv; (void)n; (void)v; (void)l; FAIL(ENOSYS); }
int rfcntl(int s, int c, ...) { (void)s; (void)c; FAIL(ENOSYS); }
off_t riomap(int s, void *b, size_t l, int p, int f, off_t o) { (void)s; (void)b; (void)l; (void)p; (void)f; (void)o; FAIL(ENOSYS); }
int riounmap(int s, void *b, size_t l) { (void)s; (void)b; (void)l; FAIL(ENOSYS); }
size_t riowrite(int s, const void *b, size_t c, off_t o, int f) { (void)s; (void)b; (void)c; (void)o; (void)f; errno = ENOSYS; return 0; }
