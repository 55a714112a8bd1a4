"""The browser demo: Gradio page over the same Classifier the CLI uses.

Upload or drop any file (decoded by apps.images, so bad files get a clear message instead of a
generic component error), or click a bundled example. Shows top-k with confidence bars, latency,
the model's name/description from its metadata, and an attention-rollout overlay when the .tflite
exports attention or a matching .keras is given.
"""

import logging
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline: no telemetry, no version check

import numpy as np  # noqa: E402

from .attention import attention_heatmap, overlay  # noqa: E402
from .classifier import Classifier  # noqa: E402
from .examples import bundled_examples  # noqa: E402
from .images import ImageError, load_image  # noqa: E402

MAX_UPLOAD_MB = 10
SESSION_CAPACITY = 64


class KerasAttention:
    """Attention rollout from the matching .keras model; the only place the app imports vit_keras (lazily)."""

    def __init__(self, path):
        import keras

        import vit_keras  # noqa: F401  (registers the layers for loading)

        self.model = keras.models.load_model(path, safe_mode=True)
        config = getattr(self.model, "vit_config", None)
        if config is None:
            raise ValueError(f"--keras {path} is not a vit_keras VisionTransformer")
        self.size = tuple(config["image_size"]) if isinstance(config["image_size"], (list, tuple)) else (
            config["image_size"],) * 2
        self.channels = config["channels"]
        self.grid = tuple(self.model.patch_encoder.grid_size)

    def __call__(self, image):
        from PIL import Image

        image = image.convert("L" if self.channels == 1 else "RGB").resize(self.size[::-1], Image.BILINEAR)
        from vit_keras.visualize import model_inputs

        pixels = np.asarray(image, np.float32).reshape(1, *self.size, self.channels)
        maps = self.model.attention_maps(model_inputs(self.model, pixels))  # normalized as the model's config says
        return attention_heatmap([np.stack(maps, axis=1)], self.grid)


def top_scores(top):
    """{label: score} for Gradio's Label; a repeated name (ImageNet has two "crane"s) gets a number, not merged."""
    scores = {}
    for label, score in top:
        key, n = label, 2
        while key in scores:
            key, n = f"{label} ({n})", n + 1
        scores[key] = score
    return scores


def _status(prediction, classifier):
    name = os.path.basename(prediction.path)
    return (f"{name}: **{prediction.top[0][0]}** ({prediction.top[0][1]:.1%}) · model {prediction.inference_ms:.2f} ms"
            f" · total {prediction.total_ms:.2f} ms · {classifier.name}")


def build_demo(classifier, keras_attention=None, examples=None, top_k=5):
    """The gr.Blocks page for ``classifier`` (a Classifier)."""
    import gradio as gr

    examples = bundled_examples() if examples is None else examples
    info = classifier.info
    source = ("the model's attention output" if classifier.has_attention else
              "the .keras model" if keras_attention else None)

    def classify(path):
        if not path:
            return None, None, "Upload an image or pick an example."
        try:
            if os.path.getsize(path) > MAX_UPLOAD_MB * 1024 * 1024:
                raise ImageError(f"{os.path.basename(path)}: larger than the {MAX_UPLOAD_MB} MB upload limit")
            image, _ = load_image(path, target_size=(classifier.width, classifier.height))
            prediction = classifier.classify_image(image, top_k=top_k, path=path)
        except ImageError as error:
            return None, None, f"**Error:** {error}"
        except Exception as error:  # keep serving; say what failed instead of a bare "Error" toast
            return None, None, f"**Error:** {os.path.basename(path)}: could not classify it ({type(error).__name__}: {error})"
        heat = prediction.attention
        if heat is None and keras_attention is not None:
            try:
                heat = keras_attention(image)
            except Exception as error:  # the overlay is extra: still show the classification
                logging.getLogger("vit_keras.apps.web").warning("attention overlay failed: %s", error)
        return overlay(image, heat), top_scores(prediction.top), _status(prediction, classifier)

    def pick_example(event: gr.SelectData):
        return classify(examples[event.index][0])

    description = info.description or "(no description in the model's metadata)"
    details = (f"input {classifier.height}×{classifier.width}×{classifier.channels} {classifier.input_dtype}, "
               f"{classifier.num_classes} classes, LiteRT {classifier.runtime}")
    # Uploads and rendered overlays live in Gradio's cache: every 10 minutes drop files older than an hour.
    with gr.Blocks(title=f"vit-keras · {classifier.name}", analytics_enabled=False,
                   delete_cache=(600, 3600)) as demo:
        gr.Markdown(f"# {classifier.name}\n{description}\n\n<small>{details}"
                    + (f" · attention overlay from {source}" if source else "") + "</small>",
                    elem_id="model-info")
        with gr.Row():
            with gr.Column():
                upload = gr.File(label=f"Upload or drop an image (max {MAX_UPLOAD_MB} MB)", type="filepath",
                                 elem_id="upload")
                gallery = gr.Gallery(value=[(p, c) for p, c in examples], label="Examples: click one", columns=6,
                                     height=300, allow_preview=False, buttons=[], elem_id="examples")
            with gr.Column():
                status = gr.Markdown("Upload an image or pick an example.", elem_id="status")
                label = gr.Label(num_top_classes=top_k, label="Top classes", elem_id="scores")
                shown = gr.Image(label="Input" + (" with attention rollout" if source else ""), type="pil",
                                 interactive=False, elem_id="shown", height=300)
        # The drop zone empties after each upload, ready for the next file; the image shows on the right.
        upload.upload(lambda path: (*classify(path), None), inputs=upload, outputs=[shown, label, status, upload],
                      api_name="classify_upload")
        gallery.select(pick_example, inputs=None, outputs=[shown, label, status], api_name="classify_example")
    return demo


def _limit_malloc_arenas(arenas=2):
    """glibc gives each thread pool thread its own malloc arena, and RSS then creeps up under concurrent load
    (docs/runtimes.md#the-gradio-page). Same as MALLOC_ARENA_MAX=2."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc


def serve(model_path, host="127.0.0.1", port=7860, keras_path=None, top_k=5, workers=2, threads=None,
          runtime="interpreter"):
    """Load the model and run the server until interrupted."""
    classifier = Classifier(model_path, threads=threads, workers=workers, runtime=runtime)  # a bad file fails fast
    _limit_malloc_arenas()
    import gradio as gr

    keras_attention = KerasAttention(keras_path) if keras_path else None
    examples = bundled_examples()
    demo = build_demo(classifier, keras_attention, examples, top_k)
    # Decoding and drawing overlap with inference; the interpreter pool still bounds concurrent invokes.
    demo.queue(default_concurrency_limit=2 * workers, max_size=256)
    allowed = sorted({os.path.dirname(p) for p, _ in examples})
    print(f"vit-keras serve: {classifier.name} on http://{host}:{port}", flush=True)
    demo.launch(server_name=host, server_port=port, share=False, inbrowser=False, show_error=True,
                max_file_size=f"{MAX_UPLOAD_MB}mb", allowed_paths=allowed, quiet=True, ssr_mode=False,
                # Gradio keeps per-session state for up to 10,000 sessions by default, and every API
                # call without a session is a new one: bound it so memory stays flat.
                state_session_capacity=SESSION_CAPACITY, run_history=False,
                theme=gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["monospace"]))
