#include "parallel/shard.h"

void loom_dp_shard_range(size_t n, int world, int rank, size_t *lo, size_t *hi) {
    size_t S = (n + (size_t)world - 1) / (size_t)world;
    S = (S + 15) / 16 * 16;
    size_t a = (size_t)rank * S, b = a + S;
    *lo = a < n ? a : n;
    *hi = rank == world - 1 || b > n ? n : b;
}
