// The pool-size rule (SPEC; include/kpool/kpool.h): every device takes every
// power of two from 1 to KPOOL_MAX_POOL_SIZE, so code that passes on the CPU
// never meets KPOOL_ERROR_UNSUPPORTED on a GPU for its pool size. Read from
// the variant table this build links (runtime/dispatch.h): the CPU and
// every CUDA family built. (A development build configured with fewer
// KPOOL_CUDA_POOL_SIZES fails here, as its library refuses the others.)
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch.h"
#include "kpool/kpool.h"

namespace kpool_test {
namespace {

namespace rt = kpool::rt;

std::set<int> contract_pool_sizes() {
    std::set<int> sizes;
    for (int P = 1; P <= KPOOL_MAX_POOL_SIZE; P *= 2) {
        sizes.insert(P);
    }
    return sizes;
}

std::vector<rt::Family> built_families() {
#define KPOOL_FAMILY_VALUE(family, capability) rt::Family::family,
    return {rt::Family::cpu, KPOOL_FOR_EACH_CUDA_FAMILY(KPOOL_FAMILY_VALUE)};
#undef KPOOL_FAMILY_VALUE
}

// A kind of kernel that has a pool size, with the variant's other keys.
using PooledKind = std::tuple<rt::Kernel, rt::ElementType, rt::Arithmetic>;

std::string describe(const PooledKind &k) {
    std::ostringstream s;
    s << "kind #" << static_cast<int>(std::get<0>(k)) << ", type " << rt::name(std::get<1>(k))
      << ", arithmetic " << rt::name(std::get<2>(k));
    return s.str();
}

// Each pooled kind of `family` and the pool sizes built for it.
std::map<PooledKind, std::set<int>> pool_sizes_of(rt::Family family) {
    std::map<PooledKind, std::set<int>> sizes;
    for (const rt::VariantKey &k : rt::variants_of(family)) {
        if (k.pool_size > 0) {
            sizes[{k.kind, k.type, k.arithmetic}].insert(k.pool_size);
        }
    }
    return sizes;
}

// The block-per-request decode (schedules/cuda/decode_block.cpp): a layout
// the runtime takes only when a call is forced into it, built for some pool
// sizes (KPOOL_CUDA_BLOCK_POOL_SIZES); a call of another runs the warp per
// token (DECODE_UPDATE, which this test holds to every size).
bool optional_layout(rt::Kernel kind) {
    return kind == rt::Kernel::DECODE_UPDATE_BY_BLOCK || kind == rt::Kernel::DECODE_UPDATE_RAGGED_BY_BLOCK;
}

TEST(PoolSizes, EveryDeviceTakesEveryPowerOfTwoUpToTheMax) {
    const std::set<int> contract = contract_pool_sizes();
    for (rt::Family family : built_families()) {
        const auto sizes = pool_sizes_of(family);
        EXPECT_FALSE(sizes.empty()) << rt::name(family) << " has no kernel with a pool size";
        for (const auto &[kind, built] : sizes) {
            if (optional_layout(std::get<0>(kind))) {
                EXPECT_TRUE(std::includes(contract.begin(), contract.end(), built.begin(), built.end()))
                    << rt::name(family) << ", " << describe(kind);
                continue;
            }
            EXPECT_EQ(built, contract) << rt::name(family) << ", " << describe(kind);
        }
    }
}

// The kind a CUDA family runs where the CPU runs `kind`: the same, but for
// the prefill insert's pools and seed in one kernel, which CUDA builds as a
// words kernel only (other rows take compress, then the seed).
rt::Kernel cuda_kind_of(rt::Kernel kind) {
    return kind == rt::Kernel::COMPRESS_TOKENS_AND_SEED ? rt::Kernel::COMPRESS_TOKENS_AND_SEED_WORDS : kind;
}

// Every pooled kind the CPU runs (compress into the cache and into rows,
// the prefill insert with its seed and from the ring, decode's completions)
// each CUDA family runs too, in the CPU's (exact) arithmetic.
TEST(PoolSizes, EveryCudaFamilyHasTheCpusPooledKinds) {
    const auto cpu = pool_sizes_of(rt::Family::cpu);
    ASSERT_FALSE(cpu.empty());
    for (rt::Family family : built_families()) {
        if (family == rt::Family::cpu) {
            continue;
        }
        const auto gpu = pool_sizes_of(family);
        for (const auto &[kind, built] : cpu) {
            const auto it = gpu.find({cuda_kind_of(std::get<0>(kind)), std::get<1>(kind), std::get<2>(kind)});
            ASSERT_NE(it, gpu.end()) << rt::name(family) << " lacks the CPU's " << describe(kind);
            EXPECT_EQ(it->second, built) << rt::name(family) << ", " << describe(kind);
        }
    }
}

}  // namespace
}  // namespace kpool_test
