from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.planner import plan_capacity

CAT = load_catalog()


def test_raw_bytes_match_the_guides_arithmetic():
    report = plan_capacity(CAT.models["kimi-k3.1-pro"], CAT.hardware["b300"], gpus=8)
    assert report.raw_bytes == {"bf16": 5.6e12, "8bit": 2.8e12, "4bit": 1.4e12}


def test_refuses_kimi_on_one_consumer_card_with_a_reason():
    report = plan_capacity(CAT.models["kimi-k3.1-pro"], CAT.hardware["rtx4090"], gpus=1)
    assert not report.fits
    assert "kimi-k3.1-pro needs 1.49 TB" in report.reason and "24564 MiB" in report.reason


def test_accepts_eight_b300():
    recipe = CAT.recipes["kimi-k3.1-pro-vllm-b300"]
    report = plan_capacity(CAT.models["kimi-k3.1-pro"], CAT.hardware["b300"], gpus=8, recipe=recipe)
    assert report.fits
    # MXFP4 with one 8-bit scale per 32 weights: 2.8e12 x 4.25 / 8 bytes, shared by 8 GPUs.
    assert round(report.weights_per_gpu_bytes / 1e9, 1) == 185.9
    assert report.kv_room_per_gpu_bytes > 50e9


def test_disk_counts_checkpoint_rollback_copy_and_temp():
    report = plan_capacity(CAT.models["qwen3-8b"], CAT.hardware["h200"], gpus=1, keep_revisions=1)
    assert report.checkpoint_bytes == 16.4e9 and not report.checkpoint_estimated
    assert report.disk_needed_bytes == 16.4e9 * 2 + 16.4e9 * 0.05


def test_gguf_recipe_uses_the_quant_size_and_overhead():
    recipe = CAT.recipes["kimi-k3-llamacpp-h200"]
    report = plan_capacity(CAT.models["kimi-k3"], CAT.hardware["h200"], gpus=8, recipe=recipe)
    assert report.checkpoint_bytes == 594e9
    assert report.weights_per_gpu_bytes == 594e9 * 1.15 / 8
    assert report.fits


def test_more_gpus_than_the_hardware_carries_is_refused():
    report = plan_capacity(CAT.models["qwen3-8b"], CAT.hardware["h200"], gpus=16)
    assert not report.fits and "carry 8 GPUs" in report.reason
