"""`vit-keras serve MODEL.tflite [--host 127.0.0.1] [--port 7860] [--in-browser]`: the browser demo (Gradio, offline),
or with --in-browser the static site of `vit-keras export-web`, where the model runs in the visitor's browser."""

import argparse

from vit_keras.apps.commands import add_runtime_arguments, positive_int

HELP = "Serve a web page that classifies uploaded or example images with a .tflite model."


def _port(text):
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be 1-65535, got {value}")
    return value


def add_arguments(parser):
    parser.add_argument("model", help="a .tflite exported by `vit-keras export`")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=_port, default=7860, help="port (default 7860)")
    parser.add_argument("--keras", default=None, help="the matching .keras, for an attention overlay when the "
                                                      ".tflite has no attention output (loads TensorFlow)")
    parser.add_argument("--top-k", type=positive_int, default=5, help="labels shown (default 5)")
    parser.add_argument("--workers", type=positive_int, default=2, help="concurrent inferences (default 2)")
    parser.add_argument("--in-browser", action="store_true", help="serve `vit-keras export-web`'s static site "
                                                                  "instead: the model runs in the browser")
    add_runtime_arguments(parser)


def run(args):
    import os

    if args.in_browser:
        if args.keras:
            raise ValueError("--keras draws the attention overlay on the Gradio page; --in-browser serves a static "
                             "site that has none")
        from vit_keras.apps.web_export import serve_site

        serve_site(args.model, host=args.host, port=args.port, top_k=args.top_k)
        return 0
    from vit_keras.apps.web import serve

    if args.keras and not os.path.isfile(args.keras):
        raise FileNotFoundError(f"no such .keras file: {args.keras}")
    serve(args.model, host=args.host, port=args.port, keras_path=args.keras, top_k=args.top_k,
          workers=args.workers, threads=args.threads, runtime=args.runtime)
    return 0
