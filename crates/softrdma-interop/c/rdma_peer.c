/*
 * rdma_peer: the guest-side end of softrdma's interop tests, written against libibverbs
 * (runs on rdma_rxe in the peer guests, which have no compiler: build it on the host with
 * `cc -O2 -o rdma_peer rdma_peer.c -libverbs` and copy it through /xfer).
 *
 * It speaks the protocol of crates/softrdma-interop/src/lib.rs (keep the two in step):
 *   - TCP: this program listens on -p PORT and takes one connection (or connects to -c IP).
 *     Each side sends one line
 *       "SRP1 <qpn> <psn> <gid 32 hex> <addr> <rkey>\n"
 *     (decimal numbers, addr/rkey of its one region), connects its QP to RTS, sends "R\n"
 *     and waits for the other's "R\n".
 *   - The region layout and the byte patterns are fixed (see the constants below).
 *   - role active: READ, WRITE, SEND with immediate for every size, then Fetch&Add and
 *     Compare&Swap, then a zero-length SEND with immediate FIN_IMM; it checks what it read and
 *     the atomics' original values, then reads the other side's verdict line.
 *   - role passive: posts receives, waits for them, checks what was written and sent and the
 *     atomic words, writes "OK\n" or "FAIL <why>\n", waits for the other side to close.
 * Exit status 0 only when every check passed (for the active side: its own and the peer's).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const uint32_t SIZES[] = {1, 1024, 1025, 4096, 9000, 65536};
#define NSIZES (sizeof(SIZES) / sizeof(SIZES[0]))
#define SEED_R 1 /* region R: read by the active side */
#define SEED_S 2 /* region S: the active side writes it into W */
#define SEED_X 3 /* region X: the active side sends it into V */
#define IMM_BASE 0x5eed0000u
#define FIN_IMM 0xf1f1f1f1u
#define A0_INIT 0x1000000000000001ull
#define A1_INIT 0x0000000000c0ffeeull
#define ADD0 0x42ull
#define SWAP1 0x0000000000facadeull

static uint64_t total_len(void) {
	uint64_t t = 0;
	for (size_t i = 0; i < NSIZES; i++)
		t += SIZES[i];
	return (t + 63) & ~63ull;
}
/* Areas, each total_len() long: R, W, S, D (READ destination), V (receives), X; then A
 * (two atomic words) and AR (four atomic results). */
enum { AREA_R, AREA_W, AREA_S, AREA_D, AREA_V, AREA_X, AREA_A };
static uint64_t area(int a) { return (uint64_t)a * total_len(); }
#define OFF_AR (area(AREA_A) + 64)
#define REGION_LEN (area(AREA_A) + 128)

static uint64_t slice_off(size_t r) {
	uint64_t o = 0;
	for (size_t i = 0; i < r; i++)
		o += SIZES[i];
	return o;
}
static uint8_t pattern(uint32_t seed, uint32_t i) {
	return (uint8_t)(((i + seed * 7919u) * 2654435761u) >> 24);
}

static double deadline;
static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}
static void die(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "rdma_peer: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(2);
}

static int read_line(int fd, char *buf, size_t cap) {
	size_t n = 0;
	while (n + 1 < cap) {
		ssize_t k = read(fd, buf + n, 1);
		if (k <= 0)
			return -1;
		if (buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = 0;
	return 0;
}
static void write_all(int fd, const char *s) {
	size_t n = strlen(s);
	while (n) {
		ssize_t k = write(fd, s, n);
		if (k <= 0)
			die("tcp write: %s", strerror(errno));
		s += k;
		n -= (size_t)k;
	}
}

static struct ibv_cq *cq;
static int errors;
static void fail(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fprintf(stdout, "FAIL: ");
	vfprintf(stdout, fmt, ap);
	fprintf(stdout, "\n");
	fflush(stdout);
	va_end(ap);
	errors++;
}

/* Wait for one completion (until the deadline). */
static struct ibv_wc wait_wc(void) {
	struct ibv_wc wc;
	while (now() < deadline) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("poll_cq");
		if (n == 1)
			return wc;
		usleep(50);
	}
	die("timed out waiting for a completion");
	return wc;
}

int main(int argc, char **argv) {
	const char *dev_name = "rxe0", *role = NULL, *server = NULL;
	int gidx = 1, port = 18600, mtu = 1024, timeout_s = 120, opt;
	while ((opt = getopt(argc, argv, "c:d:g:p:m:r:t:")) != -1) {
		switch (opt) {
		case 'c': server = optarg; break;
		case 'd': dev_name = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		case 'm': mtu = atoi(optarg); break;
		case 'r': role = optarg; break;
		case 't': timeout_s = atoi(optarg); break;
		default: die("usage: rdma_peer -r active|passive [-c server_ip] [-d dev] [-g gid_index] [-p port] [-m mtu] [-t s]");
		}
	}
	if (!role || (strcmp(role, "active") && strcmp(role, "passive")))
		die("-r active|passive is required");
	int active = !strcmp(role, "active");
	deadline = now() + timeout_s;
	enum ibv_mtu path_mtu = mtu == 256 ? IBV_MTU_256 : mtu == 512 ? IBV_MTU_512 : mtu == 2048 ? IBV_MTU_2048
			      : mtu == 4096 ? IBV_MTU_4096 : IBV_MTU_1024;

	/* Device, region, queues. */
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev_name))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		die("no device %s", dev_name);
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid))
		die("query_gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	uint8_t *buf = calloc(1, REGION_LEN);
	if (!pd || !buf)
		die("alloc");
	for (uint32_t i = 0; i < total_len(); i++) {
		buf[area(AREA_R) + i] = pattern(SEED_R, i);
		buf[area(AREA_S) + i] = pattern(SEED_S, i);
		buf[area(AREA_X) + i] = pattern(SEED_X, i);
	}
	uint64_t a_init[2] = {A0_INIT, A1_INIT};
	memcpy(buf + area(AREA_A), a_init, sizeof a_init);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, REGION_LEN,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					       IBV_ACCESS_REMOTE_ATOMIC);
	cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	if (!mr || !cq)
		die("reg_mr/create_cq");
	struct ibv_qp_init_attr qia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1},
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &qia);
	if (!qp)
		die("create_qp");
	srand48(time(NULL) ^ getpid());
	uint32_t psn = lrand48() & 0xffffff;

	/* TCP exchange: listen for one connection, or connect to -c SERVER. */
	struct timeval tv = {.tv_sec = timeout_s};
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = INADDR_ANY};
	int s;
	if (server) {
		if (inet_pton(AF_INET, server, &sa.sin_addr) != 1)
			die("bad server address %s", server);
		for (;;) { /* the server may not listen yet: retry until the deadline */
			s = socket(AF_INET, SOCK_STREAM, 0);
			if (!connect(s, (struct sockaddr *)&sa, sizeof sa))
				break;
			close(s);
			if (now() > deadline)
				die("connect to %s:%d: %s", server, port, strerror(errno));
			usleep(200000);
		}
	} else {
		int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1))
			die("listen on %d: %s", port, strerror(errno));
		setsockopt(ls, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		s = accept(ls, NULL, NULL);
		if (s < 0)
			die("accept: %s", strerror(errno));
		close(ls);
	}
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char line[256], gidhex[33];
	for (int i = 0; i < 16; i++)
		sprintf(gidhex + 2 * i, "%02x", gid.raw[i]);
	snprintf(line, sizeof line, "SRP1 %u %u %s %" PRIu64 " %u\n", qp->qp_num, psn, gidhex, (uint64_t)(uintptr_t)buf,
		 mr->rkey);
	write_all(s, line);
	if (read_line(s, line, sizeof line))
		die("no connection line");
	unsigned rqpn, rpsn, rrkey;
	uint64_t raddr;
	char rgid[64];
	if (sscanf(line, "SRP1 %u %u %40s %" SCNu64 " %u", &rqpn, &rpsn, rgid, &raddr, &rrkey) != 5 ||
	    strlen(rgid) != 32)
		die("bad connection line '%s'", line);
	union ibv_gid dgid;
	for (int i = 0; i < 16; i++) {
		unsigned b;
		sscanf(rgid + 2 * i, "%2x", &b);
		dgid.raw[i] = (uint8_t)b;
	}

	/* RESET -> INIT -> RTR -> RTS. */
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	if (!active) { /* receives (the QP must be in INIT): one per size, then the FIN */
		for (size_t r = 0; r <= NSIZES; r++) {
			struct ibv_sge sge = {(uintptr_t)buf + area(AREA_V) + (r < NSIZES ? slice_off(r) : 0),
					      r < NSIZES ? SIZES[r] : 0, mr->lkey};
			struct ibv_recv_wr wr = {.wr_id = 100 + r, .sg_list = &sge, .num_sge = r < NSIZES}, *bad;
			if (ibv_post_recv(qp, &wr, &bad))
				die("post_recv");
		}
	}
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = path_mtu;
	a.dest_qp_num = rqpn;
	a.rq_psn = rpsn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = dgid;
	a.ah_attr.grh.sgid_index = gidx;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					  IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
	write_all(s, "R\n");
	if (read_line(s, line, sizeof line) || strcmp(line, "R"))
		die("peer not ready");
	printf("rdma_peer: %s qpn %u <-> %u mtu %d\n", role, qp->qp_num, rqpn, mtu);
	fflush(stdout);

	if (active) {
		struct ibv_send_wr wr, *bad;
		struct ibv_sge sge;
		for (size_t r = 0; r < NSIZES; r++) {
			uint64_t off = slice_off(r);
			uint32_t len = SIZES[r];
			for (int op = 0; op < 3; op++) {
				memset(&wr, 0, sizeof wr);
				wr.wr_id = r * 3 + op;
				wr.sg_list = &sge;
				wr.num_sge = 1;
				wr.send_flags = IBV_SEND_SIGNALED;
				sge.length = len;
				sge.lkey = mr->lkey;
				if (op == 0) { /* READ remote R -> local D */
					wr.opcode = IBV_WR_RDMA_READ;
					sge.addr = (uintptr_t)buf + area(AREA_D) + off;
					wr.wr.rdma.remote_addr = raddr + area(AREA_R) + off;
				} else if (op == 1) { /* WRITE local S -> remote W */
					wr.opcode = IBV_WR_RDMA_WRITE;
					sge.addr = (uintptr_t)buf + area(AREA_S) + off;
					wr.wr.rdma.remote_addr = raddr + area(AREA_W) + off;
				} else { /* SEND with immediate local X -> remote V */
					wr.opcode = IBV_WR_SEND_WITH_IMM;
					sge.addr = (uintptr_t)buf + area(AREA_X) + off;
					wr.imm_data = htonl(IMM_BASE + (uint32_t)r);
				}
				wr.wr.rdma.rkey = rrkey;
				if (ibv_post_send(qp, &wr, &bad))
					die("post_send");
			}
			for (int op = 0; op < 3; op++) {
				struct ibv_wc wc = wait_wc();
				if (wc.status != IBV_WC_SUCCESS || wc.wr_id != r * 3 + op)
					die("wr %" PRIu64 ": %s", wc.wr_id, ibv_wc_status_str(wc.status));
			}
			for (uint32_t i = 0; i < len; i++)
				if (buf[area(AREA_D) + off + i] != pattern(SEED_R, (uint32_t)off + i)) {
					fail("READ of %u bytes: byte %u differs", len, i);
					break;
				}
		}
		/* Atomics: FADD, CAS that swaps, CAS that does not, FADD. */
		struct {
			int cas;
			int word;
			uint64_t x, y, expect;
		} at[4] = {
			{0, 0, ADD0, 0, A0_INIT},
			{1, 1, A1_INIT, SWAP1, A1_INIT},
			{1, 1, A1_INIT, 0xbad, SWAP1},
			{0, 0, 1, 0, A0_INIT + ADD0},
		};
		for (int k = 0; k < 4; k++) {
			memset(&wr, 0, sizeof wr);
			wr.wr_id = 1000 + k;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.send_flags = IBV_SEND_SIGNALED;
			sge.addr = (uintptr_t)buf + OFF_AR + 8 * k;
			sge.length = 8;
			sge.lkey = mr->lkey;
			wr.opcode = at[k].cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
			wr.wr.atomic.remote_addr = raddr + area(AREA_A) + 8 * at[k].word;
			wr.wr.atomic.rkey = rrkey;
			wr.wr.atomic.compare_add = at[k].x;
			wr.wr.atomic.swap = at[k].y;
			if (ibv_post_send(qp, &wr, &bad))
				die("post_send atomic");
			struct ibv_wc wc = wait_wc();
			if (wc.status != IBV_WC_SUCCESS)
				die("atomic %d: %s", k, ibv_wc_status_str(wc.status));
			uint64_t got;
			memcpy(&got, buf + OFF_AR + 8 * k, 8);
			if (got != at[k].expect)
				fail("atomic %d returned %#" PRIx64 ", expected %#" PRIx64, k, got, at[k].expect);
		}
		/* FIN: zero-length SEND with immediate. */
		memset(&wr, 0, sizeof wr);
		wr.wr_id = 2000;
		wr.opcode = IBV_WR_SEND_WITH_IMM;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.imm_data = htonl(FIN_IMM);
		if (ibv_post_send(qp, &wr, &bad))
			die("post_send FIN");
		struct ibv_wc wc = wait_wc();
		if (wc.status != IBV_WC_SUCCESS)
			die("FIN: %s", ibv_wc_status_str(wc.status));
		if (read_line(s, line, sizeof line))
			die("no verdict from the passive side");
		printf("rdma_peer: passive side says: %s\n", line);
		if (strncmp(line, "OK", 2))
			errors++;
	} else {
		for (size_t r = 0; r <= NSIZES; r++) {
			struct ibv_wc wc = wait_wc();
			uint32_t imm = ntohl(wc.imm_data);
			uint32_t want_len = r < NSIZES ? SIZES[r] : 0, want_imm = r < NSIZES ? IMM_BASE + (uint32_t)r : FIN_IMM;
			if (wc.status != IBV_WC_SUCCESS) {
				fail("receive %zu: %s", r, ibv_wc_status_str(wc.status));
				break;
			}
			if (wc.opcode != IBV_WC_RECV || !(wc.wc_flags & IBV_WC_WITH_IMM) || imm != want_imm ||
			    wc.byte_len != want_len || wc.wr_id != 100 + r)
				fail("receive %zu: wr_id %" PRIu64 " opcode %d imm %#x len %u", r, wc.wr_id, wc.opcode, imm,
				     wc.byte_len);
		}
		/* The FIN's completion means every earlier WRITE and atomic is done. */
		for (size_t r = 0; r < NSIZES; r++) {
			uint64_t off = slice_off(r);
			for (uint32_t i = 0; i < SIZES[r]; i++) {
				if (buf[area(AREA_W) + off + i] != pattern(SEED_S, (uint32_t)off + i)) {
					fail("WRITE of %u bytes: byte %u differs", SIZES[r], i);
					break;
				}
			}
			for (uint32_t i = 0; i < SIZES[r]; i++) {
				if (buf[area(AREA_V) + off + i] != pattern(SEED_X, (uint32_t)off + i)) {
					fail("SEND of %u bytes: byte %u differs", SIZES[r], i);
					break;
				}
			}
		}
		uint64_t w[2];
		memcpy(w, buf + area(AREA_A), sizeof w);
		if (w[0] != A0_INIT + ADD0 + 1 || w[1] != SWAP1)
			fail("atomic words are %#" PRIx64 " %#" PRIx64, w[0], w[1]);
		write_all(s, errors ? "FAIL data\n" : "OK\n");
		/* Keep the QP until the active side has its FIN acknowledged and closes. */
		while (read(s, line, sizeof line) > 0 && now() < deadline)
			;
	}
	printf("rdma_peer: %s %s (%d errors)\n", role, errors ? "FAILED" : "passed", errors);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return errors ? 1 : 0;
}
