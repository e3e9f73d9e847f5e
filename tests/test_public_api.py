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
        "DEFAULT_FORMATS",
        "DEFAULT_MAX_BYTES",
        "DEFAULT_MAX_PIXELS",
        "DEFAULT_MAX_REDIRECTS",
        "DEFAULT_TIMEOUT_S",
        "Fetcher",
        "ImagePolicy",
        "Resolver",
        "decode_data_url",
        "encode_png",
        "image_hash",
        "is_public_address",
        "load_image",
        "png_data_url",
        "SourceKey",
        "source_key",
        "system_resolver",
    }
    for name in vf_mm.images.__all__:
        assert hasattr(vf_mm.images, name), name


def test_videos_exports():
    import vf_mm.videos

    assert set(vf_mm.videos.__all__) == {
        "DEFAULT_MAX_BYTES",
        "DEFAULT_MAX_DECODED_BYTES",
        "DEFAULT_MAX_DURATION_S",
        "DEFAULT_MAX_FRAMES",
        "DEFAULT_MAX_PIXELS_PER_FRAME",
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
        "RESULTS_FORMAT",
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
        "CHAT_TEMPLATES",
        "IMAGE_BACKENDS",
        "QWEN2_VL_TEMPLATE",
        "QWEN3_VL_TEMPLATE",
        "QWEN_VL_FAMILIES",
        "TEMPLATE_VARIANTS",
        "VISION_FAMILIES",
        "VIDEO_FAMILIES",
        "VIDEO_OPTIONS",
        "ExpandedVideo",
        "SampledVideo",
        "VideoSettings",
        "VisionFamily",
        "build_tiny_lm",
        "build_tiny_vlm",
        "cached_tiny_vlm",
        "chat_template",
        "embedded_model",
        "expand_image",
        "expand_video",
        "family_info",
        "image_backend_of",
        "image_kwargs",
        "image_processor_class",
        "image_token_ids",
        "load_processor",
        "load_video_settings",
        "model_class",
        "model_inputs",
        "model_type",
        "processor_class",
        "qwen_tokenizer",
        "resolve_image_backend",
        "sample_frames",
        "torchvision_available",
        "tiny_tokenizer",
    }
    for name in vf_mm.models.__all__:
        assert hasattr(vf_mm.models, name), name
    assert vf_mm.models.QWEN_VL_FAMILIES == ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
    assert set(vf_mm.models.CHAT_TEMPLATES) == set(vf_mm.models.VISION_FAMILIES)
    assert set(vf_mm.models.QWEN_VL_FAMILIES) < set(vf_mm.models.VISION_FAMILIES)
    assert set(vf_mm.models.TEMPLATE_VARIANTS) < set(vf_mm.models.VISION_FAMILIES)
    for family, variants in vf_mm.models.TEMPLATE_VARIANTS.items():  # the default comes first
        assert vf_mm.models.chat_template(family) == next(iter(variants.values()))
        assert vf_mm.models.CHAT_TEMPLATES[family] == vf_mm.models.chat_template(family)


def test_testing_reexports_the_models_and_inference_names():
    import vf_mm.inference
    import vf_mm.models
    import vf_mm.testing

    assert set(vf_mm.testing.__all__) == {
        "FAMILIES",
        "ScriptedBackend",
        "ScriptedChatBackend",
        "build_tiny_lm",
        "build_tiny_vlm",
    }
    assert vf_mm.testing.build_tiny_vlm is vf_mm.models.build_tiny_vlm
    assert vf_mm.testing.build_tiny_lm is vf_mm.models.build_tiny_lm
    assert vf_mm.testing.ScriptedBackend is vf_mm.inference.ScriptedBackend
    assert vf_mm.testing.FAMILIES == vf_mm.models.QWEN_VL_FAMILIES
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
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_inference_exports_the_managed_servers():
    import vf_mm.inference

    assert {"VLLMBackend", "VLLMServers", "ServerLimits", "server_flags", "vllm_command"} <= set(
        vf_mm.inference.__all__
    )
    # VLLMBackend's settings objects
    assert {"Retry", "Routing", "Auth"} <= set(vf_mm.inference.__all__)
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
        "GROUP_FORMAT_BY_SOURCE",
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
        "grpo_loss",
        "inputs_hash",
        "is_endpoint",
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
