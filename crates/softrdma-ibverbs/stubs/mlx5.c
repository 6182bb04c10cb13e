/* softrdma stub of libmlx5.so.1: perftest links these mlx5dv entry points but calls them
 * only in DC, crypto and mkey modes, which softrdma devices do not offer. Each fails cleanly:
 * NULL with errno EOPNOTSUPP, or the errno value EOPNOTSUPP. Written for softrdma. */
#include <errno.h>
#include <stddef.h>

#define FAIL_PTR { errno = EOPNOTSUPP; return NULL; }
#define FAIL_INT { return EOPNOTSUPP; }

void *mlx5dv_create_qp(void *ctx, void *attr, void *mlx5_attr) FAIL_PTR
void *mlx5dv_open_device(void *device, void *attr) FAIL_PTR
int mlx5dv_devx_general_cmd(void *ctx, const void *in, size_t inlen, void *out, size_t outlen) FAIL_INT
void *mlx5dv_create_mkey(void *attr) FAIL_PTR
int mlx5dv_destroy_mkey(void *mkey) FAIL_INT
void *mlx5dv_qp_ex_from_ibv_qp_ex(void *qp) FAIL_PTR
int mlx5dv_crypto_login(void *ctx, void *attr) FAIL_INT
void *mlx5dv_dek_create(void *ctx, void *attr) FAIL_PTR
int mlx5dv_dek_destroy(void *dek) FAIL_INT
int mlx5dv_is_supported(void *device) { (void)device; return 0; }
