/* The pinned mode through verbs.h (SOFTRDMA_PIN unset: pinned is the default), as a process
 * without CAP_IPC_LOCK under a 64 KiB RLIMIT_MEMLOCK: ibv_reg_mr beyond the limit fails with
 * ENOMEM and pins nothing; two contexts (devices) registering the same pages share the lock,
 * which stays until the last of their registrations goes. Checked against VmLck. */
#include <errno.h>
#include <linux/capability.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

#define PAGE 4096
#define LIMIT (16 * PAGE)

/* VmLck of this process, in bytes (-1 if unreadable). */
static long vmlck(void)
{
	char line[256];
	long kb = -1;
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmLck: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb < 0 ? -1 : kb * 1024;
}

/* Drop CAP_IPC_LOCK (effective and permitted) and lower RLIMIT_MEMLOCK. */
static int become_unprivileged(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d))
		return 1;
	d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
	d[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
	if (syscall(SYS_capset, &h, d))
		return 2;
	struct rlimit r = { .rlim_cur = LIMIT, .rlim_max = LIMIT };
	if (setrlimit(RLIMIT_MEMLOCK, &r))
		return 3;
	return 0;
}

int main(void)
{
	int rc = become_unprivileged();
	if (rc) {
		printf("FAIL: cannot drop CAP_IPC_LOCK / set RLIMIT_MEMLOCK (step %d, errno %d)\n", rc, errno);
		return 1;
	}
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n != 2) {
		printf("FAIL: device list n=%d\n", n);
		return 1;
	}
	struct ibv_context *c0 = ibv_open_device(list[0]), *c1 = ibv_open_device(list[1]);
	struct ibv_pd *p0 = c0 ? ibv_alloc_pd(c0) : NULL, *p1 = c1 ? ibv_alloc_pd(c1) : NULL;
	if (!p0 || !p1) {
		printf("FAIL: open/alloc_pd errno %d\n", errno);
		return 1;
	}
	char *buf = mmap(NULL, 64 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 1;
	long base = vmlck();
	CHECK(base >= 0, "VmLck unreadable");

	/* Pages 0..12 from device 0, pages 4..12 again from device 1: 12 pages locked. */
	struct ibv_mr *a = ibv_reg_mr(p0, buf, 12 * PAGE, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *b = ibv_reg_mr(p1, buf + 4 * PAGE, 8 * PAGE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(a && b, "registrations within the limit: errno %d", errno);
	CHECK(vmlck() - base == 12 * PAGE, "VmLck +%ld, want %d", vmlck() - base, 12 * PAGE);

	/* 8 more pages would take the process to 20 > 16: ENOMEM, nothing pinned. */
	errno = 0;
	struct ibv_mr *c = ibv_reg_mr(p1, buf + 32 * PAGE, 8 * PAGE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(!c && errno == ENOMEM, "beyond RLIMIT_MEMLOCK: mr %p errno %d", (void *)c, errno);
	CHECK(vmlck() - base == 12 * PAGE, "a refusal pinned nothing: VmLck +%ld", vmlck() - base);
	/* Exactly up to the limit is accepted. */
	struct ibv_mr *d = ibv_reg_mr(p1, buf + 32 * PAGE, 4 * PAGE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(d != NULL, "up to the limit: errno %d", errno);
	CHECK(vmlck() - base == LIMIT, "VmLck +%ld, want %d", vmlck() - base, LIMIT);

	/* Device 0 lets go first: device 1's pages 4..12 (and 32..36) stay locked. */
	CHECK(a && ibv_dereg_mr(a) == 0, "dereg a");
	CHECK(vmlck() - base == 12 * PAGE, "after device 0's deregistration VmLck +%ld, want %d",
	      vmlck() - base, 12 * PAGE);
	CHECK(b && ibv_dereg_mr(b) == 0, "dereg b");
	CHECK(d && ibv_dereg_mr(d) == 0, "dereg d");
	CHECK(vmlck() == base, "all released: VmLck +%ld", vmlck() - base);

	ibv_dealloc_pd(p0);
	ibv_dealloc_pd(p1);
	ibv_close_device(c0);
	ibv_close_device(c1);
	ibv_free_device_list(list);
	munmap(buf, 64 * PAGE);
	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
