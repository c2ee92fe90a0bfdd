"""Vision transformers (ViT and kin): image classification.

The input is an image: the processor resizes it to the checkpoint's size and normalizes it, the model reads it
as a sequence of patches, and the classifier reads the [CLS] position.
"""

from __future__ import annotations

import io

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.job.spec import Job
from hftoolkit.metrics import EvalMetrics
from hftoolkit.models.families import label_records, labels


class ImageClassification:
    """One label per image: accuracy and macro F1; records give label and probability."""

    def load_model(self, job: Job):
        """Image processor and image classifier; LoRA on q/v with the classifier in modules_to_save."""
        import transformers as tf

        from hftoolkit.models import loading

        processor = job.model.processor
        # peft has no image-classification task type: the plain PeftModel passes pixel_values and labels through.
        model = loading.load_task_model(tf.AutoModelForImageClassification, job, None,
                                         ignore_mismatched_sizes=True, **labels.label_config(job))
        return model, processor

    def preprocess(self, job: Job, processor, dataset):
        """Check every image can be opened, then turn "image" into pixel_values and "label" into labels per batch.

        Images are decoded and transformed per batch as they are drawn (`with_transform`), so a large image folder
        is never expanded into a cache of float tensors (a 224x224 RGB image is 600 KB as pixel_values)."""
        import datasets

        feature = dataset.features["image"]
        if not isinstance(feature, datasets.Image) and feature != datasets.Value("string"):
            d = job.recipe.data
            raise UserError(f"data.image_column: column {d.image_column!r} of {d.train} holds "
                            f"{feature}, not images: point data.image_column at an image column or at file paths")
        # Undecoded, each image is {"path", "bytes"}: we decode it ourselves so a bad file can be named.
        stored = dataset.cast_column("image", datasets.Image(decode=False)).rename_column("label", "labels")
        _check_images_open(stored)

        def transform(batch):
            images = [_decode(item) for item in batch["image"]]
            return {"pixel_values": processor(images, return_tensors="pt")["pixel_values"], "labels": batch["labels"]}

        return stored.with_transform(transform)

    def collator(self, job: Job, processor):
        """Stack pixel_values (B, C, H, W) and labels (B,): every image is already the processor's size."""
        import torch

        def collate(features):
            return {"pixel_values": torch.stack([f["pixel_values"] for f in features]),
                    "labels": torch.tensor([int(f["labels"]) for f in features])}

        return collate

    def metrics(self, job: Job, processor) -> EvalMetrics:
        from hftoolkit.metrics import label_metrics

        return label_metrics(labels.metric_names(job))

    def generate(self, job: Job, model, processor, inputs: list) -> list[dict]:
        """Label and probability for each image (a PIL image, a file path, or a data set's {"path", "bytes"})."""
        import torch

        model.eval()
        id2label = model.config.id2label
        out = []
        for start in range(0, len(inputs), job.recipe.eval.batch_size):
            images = [_decode(item) for item in inputs[start:start + job.recipe.eval.batch_size]]
            pixels = processor(images, return_tensors="pt")["pixel_values"].to(model.device)
            with torch.no_grad():
                out += label_records(model(pixel_values=pixels).logits.float().softmax(-1).cpu().numpy(), id2label)
        return out


FORMULATIONS = {tasks.IMAGE_CLASSIFICATION: ImageClassification()}


# ---------------------------------------------------------------- images


def _check_images_open(stored) -> None:
    """Read every image's header (cheap: no pixels are decoded), so a bad file stops the run before training."""
    from PIL import Image

    row = 0
    for batch in stored.iter(batch_size=256):
        for item in batch["image"]:
            try:
                with Image.open(_source(item)):
                    pass
            except Exception as err:  # PIL raises several types for a file that is not an image
                raise _unreadable(item, row, err) from None
            row += 1


def _decode(item):
    """An RGB PIL image from a PIL image, a path, or {"path", "bytes"}; a clear error names a bad file."""
    from PIL import Image

    if isinstance(item, Image.Image):
        return item.convert("RGB")
    try:
        with Image.open(_source(item)) as image:
            return image.convert("RGB")  # ViT takes 3 channels; convert also forces the full decode here
    except Exception as err:
        raise _unreadable(item, None, err) from None


def _source(item):
    if isinstance(item, str):
        return item
    if item.get("bytes") is not None:
        return io.BytesIO(item["bytes"])
    if item.get("path"):
        return item["path"]
    raise ValueError("the row holds neither image bytes nor a path")


def _unreadable(item, row: int | None, err: Exception) -> UserError:
    path = item if isinstance(item, str) else (item or {}).get("path")
    what = f"image file {path}" if path else f"the image in row {row}" if row is not None else "an image in the data"
    reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
    return UserError(f"data: {what} can't be read as an image ({reason}): replace or remove it")
