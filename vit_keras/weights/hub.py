"""Hub names: ``hf://org/name`` or ``hf-hub:org/name`` (timm's spelling), optionally ``@revision``.

The folder's files come through ``huggingface_hub``'s own cache (``HF_HOME``, ``HF_HUB_OFFLINE`` and
``HF_ENDPOINT`` work as they do for transformers and timm); only the files a model needs are fetched.
"""

import os
import re

HUB_NAME = re.compile(r"(?:hf://|hf-hub:)(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<revision>[\w./-]+))?")
NEEDED = ("config.json", "model.safetensors")
OPTIONAL = ("preprocessor_config.json",)  # a Hugging Face folder's normalization and eval resize


def is_hub_name(value):
    return isinstance(value, str) and value.startswith(("hf://", "hf-hub:"))


def hub_folder(name, cache_dir=None):
    """The local folder (in huggingface_hub's cache) holding ``name``'s config and weights."""
    match = HUB_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"`weights` {name!r} is not a hub name; write hf://ORG/NAME or hf-hub:ORG/NAME "
                         "(optionally @REVISION).")
    try:
        import huggingface_hub
        from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise ImportError(f"`weights` {name!r} is downloaded with huggingface_hub: pip install huggingface_hub") \
            from None
    repo, revision = match.group("repo"), match.group("revision")
    paths = []
    for filename in NEEDED + OPTIONAL:
        try:
            paths.append(huggingface_hub.hf_hub_download(repo, filename, revision=revision, cache_dir=cache_dir))
        except LocalEntryNotFoundError as error:
            if filename in NEEDED:
                raise FileNotFoundError(f"{name}: {filename} is not in the huggingface_hub cache and the hub can't "
                                        f"be reached ({error}). Download it once online, or pass the folder.") \
                    from None
        except EntryNotFoundError:
            if filename in NEEDED:
                raise FileNotFoundError(f"{name}: the repository has no {filename}; a ViT folder needs "
                                        f"{' and '.join(NEEDED)}.") from None
        except HfHubHTTPError as error:
            status = getattr(error.response, "status_code", None)
            if status == 404 and filename in OPTIONAL:
                continue
            raise FileNotFoundError(f"{name}: fetching {filename} failed: {error}") from None
    return os.path.dirname(paths[0])
