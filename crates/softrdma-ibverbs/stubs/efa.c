/* softrdma stub of libefa.so.1: perftest calls efadv only in SRD mode. Written for softrdma. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

int efadv_query_device(void *ctx, void *attr, uint32_t inlen) { (void)ctx; (void)attr; (void)inlen; return EOPNOTSUPP; }
void *efadv_create_qp_ex(void *ctx, void *attr_ex, void *efa_attr, uint32_t inlen)
{ (void)ctx; (void)attr_ex; (void)efa_attr; (void)inlen; errno = EOPNOTSUPP; return NULL; }
