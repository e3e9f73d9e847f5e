"""The public names vf_mm promises its users, checked the way a user reaches them."""

from __future__ import annotations

import vf_mm
import vf_mm.errors
import vf_mm.types
import vf_mm.wire


def test_wire_exports():
    assert set(vf_mm.wire.__all__) == {
        "DEFAULT_MAX_FRAME_BYTES",
        "FRAME_HEADER_SIZE",
        "STREAM_HEADER_SIZE",
        "Decoder",
        "Encoder",
        "Ext",
        "FrameHeader",
        "FrameKind",
        "StreamReader",
        "StreamWriter",
        "TensorFormat",
        "TensorType",
        "check_frame",
        "frame_header",
        "packb",
        "parse_frame_header",
        "parse_stream_header",
        "read_stream",
        "repair_stream",
        "stream_header",
        "unpackb",
        "write_stream",
    }
    for name in vf_mm.wire.__all__:
        assert hasattr(vf_mm.wire, name), name


def test_wire_dtypes_exports():
    import vf_mm.wire.dtypes

    assert set(vf_mm.wire.dtypes.__all__) == {
        "DTYPES",
        "WireDType",
        "by_code",
        "by_name",
        "from_numpy",
        "from_torch",
        "numpy_dtype",
        "torch_dtype",
        "torch_module",
    }
    for name in vf_mm.wire.dtypes.__all__:
        assert hasattr(vf_mm.wire.dtypes, name), name


def test_images_exports():
    import vf_mm.images

    assert set(vf_mm.images.__all__) == {
        "Fetcher",
        "ImagePolicy",
        "decode_data_url",
        "encode_png",
        "image_hash",
        "load_image",
        "load_image_with_png",
        "png_data_url",
        "source_key",
    }
    for name in vf_mm.images.__all__:
        assert hasattr(vf_mm.images, name), name


def test_videos_exports():
    import vf_mm.videos

    assert set(vf_mm.videos.__all__) == {
        "VIDEO_EXTENSIONS",
        "VIDEO_MEDIA_TYPES",
        "Video",
        "VideoLimits",
        "encode_lossless",
        "is_raw_video",
        "load_video",
        "read_video_bytes",
        "video_extension",
        "video_hash",
        "video_mm_hash",
    }
    for name in vf_mm.videos.__all__:
        assert hasattr(vf_mm.videos, name), name


def test_video_errors_are_value_errors_in_their_own_branch():
    from vf_mm.errors import (
        ImageError,
        UnsafeVideoSourceError,
        VideoDecodeError,
        VideoError,
        VideoFetchError,
        VideoTooLargeError,
    )

    assert issubclass(VideoError, ValueError)
    for leaf in (UnsafeVideoSourceError, VideoFetchError, VideoDecodeError, VideoTooLargeError):
        assert issubclass(leaf, VideoError) and not issubclass(leaf, ImageError)


def test_results_exports():
    import vf_mm.results

    assert set(vf_mm.results.__all__) == {
        "ASSETS_DIR",
        "METADATA_FILE",
        "RESULTS_FILE",
        "ROW_KEYS",
        "AssetStore",
        "BadLine",
        "EvalProgress",
        "MergeResult",
        "ResultsScan",
        "ResultsWriter",
        "evaluate_to_dir",
        "merge_runs",
        "pass_at_k",
        "read_metadata",
        "iter_results",
        "read_results",
        "scan_results",
        "summarize",
        "to_dataset",
        "to_json_value",
    }
    for name in vf_mm.results.__all__:
        assert hasattr(vf_mm.results, name), name
    assert issubclass(vf_mm.errors.MergeError, vf_mm.errors.ResultsError)
    assert issubclass(vf_mm.errors.AssetError, vf_mm.errors.ResultsError)


def test_every_error_descends_from_vfmmerror():
    for name in vf_mm.errors.__all__:
        cls = getattr(vf_mm.errors, name)
        assert issubclass(cls, vf_mm.errors.VfMmError), name


def test_error_tree_in_docstring_names_every_error():
    doc = vf_mm.errors.__doc__ or ""
    for name in vf_mm.errors.__all__:
        assert name in doc, f"{name} missing from the tree drawn in vf_mm.errors"


def test_types_exports_exist():
    for name in vf_mm.types.__all__:
        assert hasattr(vf_mm.types, name), name
    for name in (
        "PlaceholderRange",
        "MultiModalData",
        "RenderedTokens",
        "ResponseTokens",
        "TrajectoryStep",
        "RolloutError",
        "RolloutOutput",
    ):
        assert name in vf_mm.types.__all__


def test_models_exports():
    import vf_mm.models

    assert set(vf_mm.models.__all__) == {
        "image_backend_of",
        "IMAGE_BACKENDS",
        "resolve_image_backend",
        "torchvision_available",
        "TEMPLATE_VARIANTS",
        "TokenizerSnapshot",
        "VISION_FAMILIES",
        "VIDEO_FAMILIES",
        "VisionFamily",
        "cached_tiny_vlm",
        "embedded_model",
        "expand_image",
        "expand_video",
        "family_info",
        "forward_inputs",
        "image_token_ids",
        "load_processor",
        "load_video_settings",
        "model_class",
        "model_inputs",
        "model_type",
        "processor_class",
    }
    for name in vf_mm.models.__all__:
        assert hasattr(vf_mm.models, name), name
    assert vf_mm.models._internal.QWEN_VL_FAMILIES == ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
    assert set(vf_mm.models._internal.CHAT_TEMPLATES) == set(vf_mm.models.VISION_FAMILIES)
    assert set(vf_mm.models._internal.QWEN_VL_FAMILIES) < set(vf_mm.models.VISION_FAMILIES)
    assert set(vf_mm.models.TEMPLATE_VARIANTS) < set(vf_mm.models.VISION_FAMILIES)
    for family, variants in vf_mm.models.TEMPLATE_VARIANTS.items():  # the default comes first
        assert vf_mm.models._internal.chat_template(family) == next(iter(variants.values()))
        assert vf_mm.models._internal.CHAT_TEMPLATES[
            family
        ] == vf_mm.models._internal.chat_template(family)


def test_testing_reexports_the_models_and_inference_names():
    import vf_mm.inference
    import vf_mm.models
    import vf_mm.testing

    assert set(vf_mm.testing.__all__) == {
        "CHAT_TEMPLATES",
        "FAMILIES",
        "chat_template",
        "qwen_tokenizer",
        "tiny_tokenizer",
        "ScriptedBackend",
        "ScriptedChatBackend",
        "build_tiny_lm",
        "build_tiny_vlm",
    }
    assert vf_mm.testing.build_tiny_vlm is vf_mm.models._internal.build_tiny_vlm
    assert vf_mm.testing.build_tiny_lm is vf_mm.models._internal.build_tiny_lm
    assert vf_mm.testing.ScriptedBackend is vf_mm.inference._internal.ScriptedBackend
    assert vf_mm.testing.FAMILIES == vf_mm.models._internal.QWEN_VL_FAMILIES
    assert isinstance(vf_mm.testing.ScriptedChatBackend(["x"]), vf_mm.inference.ChatBackend)


def test_renderers_exports():
    import vf_mm.renderers

    assert "Renderer" in vf_mm.renderers.__all__
    assert {"ImageCache", "DEFAULT_CACHE_BYTES"} <= set(vf_mm.renderers.__all__)
    for name in vf_mm.renderers.__all__:
        assert hasattr(vf_mm.renderers, name), name


def test_embedded_model_is_built_once_into_the_cache(tmp_path, monkeypatch):
    from vf_mm.models import embedded_model

    monkeypatch.setenv("VF_MM_CACHE", str(tmp_path))
    path = embedded_model()
    assert path.parent == tmp_path and (path / "config.json").exists()
    built = (path / "config.json").stat().st_mtime_ns
    assert embedded_model() == path
    assert (path / "config.json").stat().st_mtime_ns == built  # reused, not rebuilt
    # no temporary left behind: the build, and the lock its first build held
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, f"{path.name}.lock"]


def test_inference_exports_the_managed_servers():
    import vf_mm.inference

    assert {"VLLMBackend", "VLLMServers", "ServerLimits", "server_flags", "vllm_command"} <= set(
        vf_mm.inference.__all__
    )
    # VLLMBackend's settings objects
    assert {"Retry", "Routing", "Auth", "Expansion"} <= set(vf_mm.inference.__all__)
    for name in vf_mm.inference.__all__:
        assert hasattr(vf_mm.inference, name), name


def test_workers_exports():
    import vf_mm.workers

    assert set(vf_mm.workers.__all__) == {
        "TRANSPORTS",
        "GroupResult",
        "GroupTask",
        "ProcessWorker",
        "Shard",
        "WorkerPool",
        "WorkerSpec",
        "parse_shard",
        "shard_of",
    }
    for name in vf_mm.workers.__all__:
        assert hasattr(vf_mm.workers, name), name
    for leaf in (vf_mm.errors.WorkerStartError, vf_mm.errors.WorkerLostError):
        assert issubclass(leaf, vf_mm.errors.WorkerError)


def test_training_exports():
    import vf_mm.training

    assert set(vf_mm.training.__all__) == {
        "GROUP_FORMAT",
        "IMAGE_MODES",
        "MAX_GROUP_ID_BYTES",
        "GroupReceiver",
        "GroupSender",
        "ImageProcessing",
        "ImageRebuilder",
        "ImageStore",
        "PruneReport",
        "RebuildFailure",
        "MicroBatch",
        "RolloutProgress",
        "Sample",
        "TensorList",
        "TrainingRollout",
        "build_samples",
        "group_advantages",
        "history_break",
        "grpo_loss",
        "inputs_hash",
        "logprob_mismatch",
        "make_batches",
        "pack_group",
        "read_groups",
        "read_ledger",
        "run_id_for",
        "stream_rollouts",
        "token_logprobs",
        "unpack_group",
        "write_key_pair",
    }
    for name in vf_mm.training.__all__:
        assert hasattr(vf_mm.training, name), name
    assert issubclass(vf_mm.errors.LedgerError, vf_mm.errors.TransportError)


def test_recording_exports():
    import vf_mm.recording

    assert set(vf_mm.recording.__all__) == {
        "RECORDING_BASE_URL",
        "RecordedSession",
        "Recorder",
        "openai_client",
    }
    for name in vf_mm.recording.__all__:
        assert hasattr(vf_mm.recording, name), name


def test_adapters_exports():
    import vf_mm.adapters

    assert set(vf_mm.adapters.__all__) == {
        "ADAPTERS",
        "VerifiersEnv",
        "adapt_verifiers",
        "is_verifiers_environment",
        "load_environment",
    }
    for name in vf_mm.adapters.__all__:
        assert hasattr(vf_mm.adapters, name), name
    assert vf_mm.load_environment is vf_mm.adapters.load_environment
    assert issubclass(vf_mm.errors.UnsupportedEnvironmentError, vf_mm.errors.EnvironmentLoadError)


def test_no_name_is_exported_by_two_packages():
    """Each public name has one home package; ``import vf_mm as vf`` (the authoring facade)
    re-exports the environment names from theirs, and is the only place that may."""
    import importlib
    import pkgutil

    homes: dict[str, list[str]] = {}
    for info in pkgutil.iter_modules(vf_mm.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"vf_mm.{info.name}")
        for name in getattr(module, "__all__", ()):
            homes.setdefault(name, []).append(module.__name__)
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}
    for name in set(vf_mm.__all__) & set(homes):  # the facade re-exports, never redefines
        (home,) = homes[name]
        assert getattr(vf_mm, name) is getattr(importlib.import_module(home), name), name


def test_one_load_environment():
    import vf_mm.envs

    assert "load_environment" not in vf_mm.envs.__all__
    assert vf_mm.load_environment is vf_mm.adapters.load_environment  # verifiers' too
