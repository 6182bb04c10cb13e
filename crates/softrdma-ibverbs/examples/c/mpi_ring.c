/*
 * mpi_ring: what an MPI job asks of the fabric, checked.
 *
 *  1. Ring ping-pong sweep: every rank r exchanges messages with rank (r + 1) % N (even ranks
 *     send first, so every link of the ring is busy at once), sizes 1 B .. 4 MiB; each rank
 *     checks every byte it receives and reports its round-trip latency (half of it, as
 *     osu_latency does) and bandwidth. Only the exchanges are timed: filling the send buffer
 *     and checking the received one are not (at 1 MiB they took longer than the transfer).
 *  2. MPI_Allreduce (MPI_SUM over doubles) of 16 MiB, whose result is known in closed form and
 *     checked element by element on every rank; repeated, with the bandwidth reported.
 *
 * Usage: mpirun ... mpi_ring [max_bytes] [iterations]
 * Exit status 0 only if every check passed on every rank; rank 0 prints a summary line
 *   mpi_ring: ok ranks=N ...
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The byte at offset i of rank r's message in round `iter`: a position-dependent base (the
 * same for every message) xor a byte of (rank, iter), so that filling and checking run at
 * memory speed (vectorized), not byte by byte. */
static unsigned char seed(int rank, int iter)
{
	return (unsigned char)(((unsigned)rank * 17u) ^ ((unsigned)iter * 7u));
}

static unsigned char *base;

static void make_base(size_t n)
{
	base = malloc(n ? n : 1);
	if (!base) {
		fprintf(stderr, "mpi_ring: out of memory\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	for (size_t i = 0; i < n; i++)
		base[i] = (unsigned char)(i * 131u);
}

static int check(const unsigned char *buf, size_t n, int rank, int iter)
{
	unsigned char s = seed(rank, iter), diff = 0;
	for (size_t i = 0; i < n; i++)
		diff |= (unsigned char)(buf[i] ^ base[i] ^ s);
	return diff == 0;
}

static void fill(unsigned char *buf, size_t n, int rank, int iter)
{
	unsigned char s = seed(rank, iter);
	for (size_t i = 0; i < n; i++)
		buf[i] = (unsigned char)(base[i] ^ s);
}

int main(int argc, char **argv)
{
	int rank, size, bad = 0;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	size_t max = argc > 1 ? strtoul(argv[1], NULL, 0) : (4u << 20);
	int iters = argc > 2 ? atoi(argv[2]) : 50;
	if (size < 2 || max == 0 || iters <= 0) {
		if (rank == 0)
			fprintf(stderr, "mpi_ring: needs 2 or more ranks, max_bytes > 0, iterations > 0\n");
		MPI_Finalize();
		return 2;
	}
	int right = (rank + 1) % size, left = (rank + size - 1) % size;
	make_base(max);
	unsigned char *sbuf = malloc(max), *rbuf = malloc(max);
	if (!sbuf || !rbuf) {
		fprintf(stderr, "mpi_ring: out of memory\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}

	if (rank == 0)
		printf("%-10s %12s %14s\n", "bytes", "lat_us(1/2rt)", "bw_MB/s");
	/* Ping-pong with the right neighbour while the left one ping-pongs with us: each rank
	 * is the initiator on its right link and the responder on its left link, with two
	 * nonblocking exchanges per round so that no rank waits on another in a cycle. */
	for (size_t n = 1; n <= max; n *= 4) {
		int it = n >= (1u << 20) ? (iters + 4) / 5 : iters;
		/* Untimed rounds first: MPI connects lazily (the first message to a peer waits for
		 * the wire-up, and UCX's first messages travel over its auxiliary transport until
		 * the connection of the fast one is up), and the first use of a size may register
		 * memory. */
		int warm = n == 1 ? 200 : (it < 5 ? it : 5);
		/* The time spent in the exchanges (from posting to completion), not in fill/check. */
		double dt = 0, worst, t;
		for (int i = -warm; i < it; i++) {
			if (i == 0)
				MPI_Barrier(MPI_COMM_WORLD);
			MPI_Request rq[2];
			/* Round 1: send to the right, receive from the left (a ring shift). */
			int tag = i < 0 ? -i : i; /* a pattern seed; any value the peer computes too */
			fill(sbuf, n, rank, tag);
			t = MPI_Wtime();
			MPI_Irecv(rbuf, (int)n, MPI_BYTE, left, 1, MPI_COMM_WORLD, &rq[0]);
			MPI_Isend(sbuf, (int)n, MPI_BYTE, right, 1, MPI_COMM_WORLD, &rq[1]);
			MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
			if (i >= 0)
				dt += MPI_Wtime() - t;
			bad += !check(rbuf, n, left, tag);
			/* Round 2: the reply travels back (send to the left, receive from the right). */
			fill(sbuf, n, rank, tag + 1);
			t = MPI_Wtime();
			MPI_Irecv(rbuf, (int)n, MPI_BYTE, right, 2, MPI_COMM_WORLD, &rq[0]);
			MPI_Isend(sbuf, (int)n, MPI_BYTE, left, 2, MPI_COMM_WORLD, &rq[1]);
			MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
			if (i >= 0)
				dt += MPI_Wtime() - t;
			bad += !check(rbuf, n, right, tag + 1);
		}
		MPI_Reduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (rank == 0)
			printf("%-10zu %12.2f %14.1f\n", n, worst / it / 2 * 1e6,
			       2.0 * (double)n * it / worst / 1e6);
	}

	/* Allreduce over 16 MiB of doubles: rank r contributes x[i] = r + i % 1000, so the sum is
	 * N(N-1)/2 + N * (i % 1000), exact in double precision. */
	size_t count = (16u << 20) / sizeof(double);
	double *x = malloc(count * sizeof(double)), *y = malloc(count * sizeof(double));
	if (!x || !y) {
		fprintf(stderr, "mpi_ring: out of memory\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	for (size_t i = 0; i < count; i++)
		x[i] = (double)rank + (double)(i % 1000);
	int reps = 3;
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (int k = 0; k < reps; k++) {
		memset(y, 0, count * sizeof(double));
		MPI_Allreduce(x, y, (int)count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		double base = (double)size * (size - 1) / 2;
		for (size_t i = 0; i < count; i++)
			if (y[i] != base + (double)size * (double)(i % 1000)) {
				bad++;
				break;
			}
	}
	double dt = (MPI_Wtime() - t0) / reps, worst;
	MPI_Reduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

	int total;
	MPI_Allreduce(&bad, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("allreduce 16 MiB: %.1f ms, %.1f MB/s (algorithm bandwidth)\n", worst * 1e3,
		       (double)(16u << 20) / worst / 1e6);
		if (total == 0)
			printf("mpi_ring: ok ranks=%d max_bytes=%zu iterations=%d\n", size, max, iters);
		else
			printf("mpi_ring: FAILED ranks=%d: %d checks failed\n", size, total);
	}
	free(x);
	free(y);
	free(sbuf);
	free(rbuf);
	free(base);
	MPI_Finalize();
	return total == 0 ? 0 : 1;
}
