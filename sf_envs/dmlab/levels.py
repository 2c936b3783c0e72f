"""DMLab-30 levels (the "contributed/dmlab30" level scripts of DeepMind Lab) and the registered env names."""
from __future__ import annotations

DMLAB30_PREFIX = "contributed/dmlab30/"

# training levels of DMLab-30, in the usual order
DMLAB30_LEVELS = (
    "rooms_collect_good_objects_train", "rooms_exploit_deferred_effects_train", "rooms_select_nonmatching_object",
    "rooms_watermaze", "rooms_keys_doors_puzzle", "language_select_described_object", "language_select_located_object",
    "language_execute_random_task", "language_answer_quantitative_question", "lasertag_one_opponent_small",
    "lasertag_three_opponents_small", "lasertag_one_opponent_large", "lasertag_three_opponents_large",
    "natlab_fixed_large_map", "natlab_varying_map_regrowth", "natlab_varying_map_randomized",
    "skymaze_irreversible_path_hard", "skymaze_irreversible_path_varied", "psychlab_arbitrary_visuomotor_mapping",
    "psychlab_continuous_recognition", "psychlab_sequential_comparison", "psychlab_visual_search",
    "explore_object_locations_small", "explore_object_locations_large", "explore_obstructed_goals_small",
    "explore_obstructed_goals_large", "explore_goal_locations_small", "explore_goal_locations_large",
    "explore_object_rewards_few", "explore_object_rewards_many",
)
# the two levels whose test variant differs from the training one
TEST_LEVELS = ("rooms_collect_good_objects_test", "rooms_exploit_deferred_effects_test")

BENCHMARK_LEVEL = "rooms_collect_good_objects_train"  # the paper's throughput benchmark level

DMLAB_ENVS = {f"dmlab_{lvl}": f"DMLab-30 level {lvl}" for lvl in DMLAB30_LEVELS + TEST_LEVELS}
DMLAB_ENVS["dmlab_benchmark"] = f"DMLab throughput benchmark of the paper ({BENCHMARK_LEVEL})"
DMLAB_ENVS["dmlab_30"] = "All 30 DMLab-30 levels: env i runs level i % 30 (multi-task training)"


def levels_of(env_name: str) -> tuple:
    """Level script paths an env name stands for (one, or 30 for dmlab_30)."""
    if env_name == "dmlab_30":
        return tuple(DMLAB30_PREFIX + lvl for lvl in DMLAB30_LEVELS)
    if env_name == "dmlab_benchmark":
        return (DMLAB30_PREFIX + BENCHMARK_LEVEL,)
    return (DMLAB30_PREFIX + env_name[len("dmlab_"):],)
