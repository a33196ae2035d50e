/// Host test: spio::AsyncPipeline in the loop of spio/block/pipeline.h, against a cp.async model.
///
/// The model plays the part of one thread's cp.async unit and the shared buffers. A copy may land
/// anywhere between its issue and the wait that covers its group, so the model checks both ends:
/// - when a copy is issued, the buffer it targets must hold no tile that is still unconsumed
///   (the copy could land at once and overwrite it);
/// - a copy lands only when a wait covers its group (the latest legal moment), so computing on
///   a buffer whose copy is still pending reads the previous contents: a stale tile.
/// Negative controls run deliberately broken loops and require the model to report them.

#include "emu_prelude.h"

#include <vector>

#include "check.h"
#include "spio/block/pipeline.h"

namespace {

constexpr int kMaxStages = 8;

struct Copy {
    int buffer;
    int tile;
};

/// One thread's cp.async groups and the pipeline's buffers.
struct Model {
    static int landed[kMaxStages];  // tile whose data each buffer holds, -1 for poison
    static std::vector<std::vector<Copy>> committed;  // pending groups, oldest first
    static std::vector<Copy> open;                      // issued, not yet committed
    static std::vector<int> consumed;                   // tiles in the order computed
    static int hazards;

    static void reset() {
        for (int &t : landed) t = -1;
        committed.clear();
        open.clear();
        consumed.clear();
        hazards = 0;
    }

    static bool is_consumed(int tile) {
        for (int t : consumed) {
            if (t == tile) return true;
        }
        return false;
    }

    static void issue(int buffer, int tile) {
        if (landed[buffer] >= 0 && !is_consumed(landed[buffer])) ++hazards;
        for (const auto &group : committed) {
            for (const Copy &c : group) {
                if (c.buffer == buffer && !is_consumed(c.tile)) ++hazards;
            }
        }
        for (const Copy &c : open) {
            if (c.buffer == buffer && !is_consumed(c.tile)) ++hazards;
        }
        open.push_back({buffer, tile});
    }

    // The Groups policy of AsyncPipeline.
    static void commit() {
        committed.push_back(open);
        open.clear();
    }

    template <int N>
    static void wait() {
        while (static_cast<int>(committed.size()) > N) {
            for (const Copy &c : committed.front()) landed[c.buffer] = c.tile;
            committed.erase(committed.begin());
        }
    }

    /// Returns false when the buffer does not hold `tile` (stale or poisoned data).
    static bool compute(int buffer, int tile) {
        consumed.push_back(tile);
        return landed[buffer] == tile;
    }
};

int Model::landed[kMaxStages];
std::vector<std::vector<Copy>> Model::committed;
std::vector<Copy> Model::open;
std::vector<int> Model::consumed;
int Model::hazards;

enum class Mistake { none, skip_empty_commits, wait_one_too_few, refill_before_wait };

/// Wait policy that lets one group more stay pending than AsyncPipeline asks for.
struct LooseWaitModel : Model {
    template <int N>
    static void wait() {
        Model::wait<N + 1>();
    }
};

/// Runs the loop of pipeline.h over num_tiles tiles; returns the number of stale reads.
template <int Stages, typename Groups>
int run_loop(int num_tiles, Mistake mistake) {
    Model::reset();
    spio::AsyncPipeline<Stages, Groups> pipe;
    int stale = 0;
    for (int s = 0; s < pipe.prefetch; ++s) {
        if (s < num_tiles) Model::issue(pipe.write_stage(), s);
        if (s < num_tiles || mistake != Mistake::skip_empty_commits) pipe.commit();
    }
    for (int i = 0; i < num_tiles; ++i) {
        const int next = i + pipe.prefetch;
        if (mistake == Mistake::refill_before_wait) {
            // Wrong order: refill the buffer about to be read.
            if (next < num_tiles) Model::issue(pipe.read_stage(), next);
        } else if (next < num_tiles) {
            Model::issue(pipe.write_stage(), next);
        }
        if (next < num_tiles || mistake != Mistake::skip_empty_commits) pipe.commit();
        pipe.wait_prior();
        // __syncthreads(): the model is one thread, so nothing to do here.
        if (!Model::compute(pipe.read_stage(), i)) ++stale;
        pipe.advance();
    }
    return stale;
}

template <int Stages>
void check_correct_loop() {
    for (int n = 1; n <= 9; ++n) {
        const int stale = run_loop<Stages, Model>(n, Mistake::none);
        CHECK(stale == 0, "%d stages, %d tiles: %d stale reads", Stages, n, stale);
        CHECK(Model::hazards == 0, "%d stages, %d tiles: %d overwrite hazards", Stages, n,
              Model::hazards);
        CHECK(static_cast<int>(Model::consumed.size()) == n, "%d stages: consumed %d of %d tiles",
              Stages, static_cast<int>(Model::consumed.size()), n);
        for (int i = 0; i < static_cast<int>(Model::consumed.size()); ++i) {
            CHECK(Model::consumed[i] == i, "%d stages: step %d computed tile %d", Stages, i,
                  Model::consumed[i]);
        }
    }
}

template <int Stages>
void check_negative_controls() {
    // Skipping empty commits near the end leaves the last tiles unwaited: stale reads.
    const int n = Stages + 3;
    const int stale_skipped = run_loop<Stages, Model>(n, Mistake::skip_empty_commits);
    CHECK(stale_skipped > 0, "%d stages: model missed the stale reads of skipped empty commits",
          Stages);
    // Waiting for one group fewer reads every tile before it lands.
    const int stale_loose = run_loop<Stages, LooseWaitModel>(n, Mistake::none);
    CHECK(stale_loose > 0, "%d stages: model missed the stale reads of a loose wait", Stages);
    // Refilling the buffer that is about to be read is an overwrite hazard.
    run_loop<Stages, Model>(n, Mistake::refill_before_wait);
    CHECK(Model::hazards > 0, "%d stages: model missed the refill hazard", Stages);
}

void check_stage_arithmetic() {
    static_assert(spio::AsyncPipeline<2>::prefetch == 1, "double buffering prefetches one tile");
    static_assert(spio::AsyncPipeline<4>::num_stages == 4, "num_stages");
    static_assert(spio::AsyncPipeline<3>::next_stage(2) == 0, "next_stage wraps");
    static_assert(spio::AsyncPipeline<3>::next_stage(1) == 2, "next_stage steps");
    spio::AsyncPipeline<2, Model> pipe;
    Model::reset();
    CHECK(pipe.read_stage() == 0 && pipe.write_stage() == 0, "initial stages");
    pipe.commit();
    CHECK(pipe.write_stage() == 1 && pipe.read_stage() == 0, "commit moves write_stage only");
    pipe.commit();
    CHECK(pipe.write_stage() == 0, "write_stage wraps");
    pipe.advance();
    CHECK(pipe.read_stage() == 1 && pipe.write_stage() == 0, "advance moves read_stage only");
}

}  // namespace

int main() {
    check_stage_arithmetic();
    check_correct_loop<2>();
    check_correct_loop<3>();
    check_correct_loop<4>();
    check_negative_controls<2>();
    check_negative_controls<3>();
    check_negative_controls<4>();
    std::printf("%d failures\n", check_failures());
    return check_failures() == 0 ? 0 : 1;
}
