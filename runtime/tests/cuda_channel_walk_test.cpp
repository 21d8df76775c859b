//===- cuda_channel_walk_test.cpp - The CUDA batch norm's index walk ------===//
//
// Part of pipec's runtime tests. cuda/channel_walk.h is plain C++ too: the
// walk must visit exactly the offsets the per-value division gave, in the
// same order (so the GPU's sums stay what they were, bit for bit), for
// every thread of a block, for rows shorter and longer than the block.
//
//===----------------------------------------------------------------------===//

#include "cuda/channel_walk.h"

#include <gtest/gtest.h>

#include <algorithm>

using pipec::cuda::channelOffset;
using pipec::cuda::ChannelWalk;

TEST(CudaChannelWalk, VisitsWhatTheDivisionGave) {
  struct Case {
    int64_t n, c, s, block;
  };
  // ResNet's shapes (S = 56x56 .. 7x7, C = 64 .. 2048), rows shorter than
  // the block, longer, equal, one row, one column.
  const Case cases[] = {{64, 64, 3136, 1024}, {64, 2048, 49, 1024},
                        {4, 3, 7, 32},        {2, 5, 32, 32},
                        {1, 1, 1, 1},         {3, 2, 1, 8},
                        {5, 4, 100, 64},      {7, 3, 13, 96}};
  for (const Case &k : cases) {
    const int64_t count = k.n * k.s;
    for (int64_t ch : {int64_t(0), k.c / 2, k.c - 1})
      for (int64_t t : {int64_t(0), int64_t(1), k.block / 2, k.block - 1}) {
        if (t >= k.block)
          continue;
        int64_t visited = 0;
        int64_t e = t;
        for (ChannelWalk w(t, k.block, ch, k.c, k.s); w.e < count;
             w.next(), e += k.block) {
          ASSERT_EQ(w.e, e);
          ASSERT_EQ(w.at, channelOffset(e, ch, k.c, k.s))
              << "n " << k.n << " c " << k.c << " s " << k.s << " block "
              << k.block << " channel " << ch << " thread " << t << " value "
              << e;
          ++visited;
        }
        EXPECT_EQ(visited, t < count ? (count - t + k.block - 1) / k.block : 0);
      }
  }
}

// batchnorm.cu's split channels: a block's walk starts at its part's first
// value plus its thread (anywhere in a row) and stops at the part's end.
TEST(CudaChannelWalk, WalksFromAPartsStartToItsEnd) {
  struct Case {
    int64_t n, c, s, parts, block;
  };
  const Case cases[] = {{8, 4, 4096, 4, 256},
                        {3, 5, 7001, 2, 256},
                        {4096, 3, 7, 3, 256},
                        {64, 64, 3136, 9, 256}};
  for (const Case &k : cases) {
    const int64_t count = k.n * k.s;
    const int64_t chunk = (count + k.parts - 1) / k.parts;
    for (int64_t ch : {int64_t(0), k.c - 1})
      for (int64_t p = 0; p < k.parts; ++p) {
        const int64_t first = p * chunk, end = std::min(first + chunk, count);
        for (int64_t t : {int64_t(0), int64_t(5), k.block - 1}) {
          int64_t e = first + t;
          for (ChannelWalk w(first + t, k.block, ch, k.c, k.s); w.e < end;
               w.next(), e += k.block)
            ASSERT_EQ(w.at, channelOffset(e, ch, k.c, k.s))
                << "s " << k.s << " part " << p << " thread " << t << " value "
                << e;
          EXPECT_GE(e, end);
          EXPECT_LT(e, end + k.block);
        }
      }
  }
}
