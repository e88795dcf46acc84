// The last block of a group to finish, for work that needs every block's output: each block
// adds itself to the group's counter after its writes are made visible, and the one that brings
// the counter to n runs the group's tail (which puts the counter back to zero for the next
// launch). All threads of the block call it; in the last block the other blocks' writes are
// visible after it (read them past L1: __ldcg).
#pragma once

__device__ __forceinline__ bool sil_last_block(int *counter, int n)
{
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(counter, 1) == n - 1;
    __syncthreads();
    if (last)
        __threadfence();
    return last;
}
