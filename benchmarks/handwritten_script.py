"""The script a user would write by hand: transformers + peft Trainer, LoRA r=8 on query/value.

Default random batches with dynamic padding; `--group-by-length` switches on the Trainer's own
length grouping (train_sampling_strategy="group_by_length" in transformers 5); `--bf16` the Trainer's
bf16=True (bf16 autocast through accelerate, on a CPU as on a GPU). Prints one JSON
line with its train seconds, accuracy and padding fraction. Used by classification.py.
"""

import argparse
import json
import time

import numpy as np
import pandas as pd
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
    set_seed,
)

parser = argparse.ArgumentParser()
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--train", required=True)
parser.add_argument("--dev", required=True)
parser.add_argument("--group-by-length", action="store_true")
parser.add_argument("--lr", type=float, default=5e-4)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=float, default=1)
parser.add_argument("--max-length", type=int, default=64)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--bf16", action="store_true", help="bf16 autocast, as the Trainer does it on a CPU too")
args = parser.parse_args()
set_seed(args.seed)  # before the model: its new head and the LoRA weights are drawn at creation

tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
train = Dataset.from_pandas(pd.read_csv(args.train))
dev = Dataset.from_pandas(pd.read_csv(args.dev))
tokenize = lambda b: tokenizer(b["text"], truncation=True, max_length=args.max_length)
train = train.map(tokenize, batched=True, remove_columns=["text"])
dev = dev.map(tokenize, batched=True, remove_columns=["text"])

model = AutoModelForSequenceClassification.from_pretrained(args.checkpoint, num_labels=2)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["query", "value"],
                                         task_type="SEQ_CLS"))

padding = {"real": 0, "total": 0}
pad = DataCollatorWithPadding(tokenizer)


def collate(features):
    batch = pad(features)
    padding["real"] += int(batch["attention_mask"].sum())
    padding["total"] += batch["attention_mask"].numel()
    return batch


def accuracy(prediction):
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


training_args = TrainingArguments(
    output_dir="/tmp/handwritten-script", per_device_train_batch_size=args.batch_size,
    per_device_eval_batch_size=64, num_train_epochs=args.epochs, learning_rate=args.lr, seed=args.seed,
    report_to="none", save_strategy="no", logging_steps=50, use_cpu=True, disable_tqdm=True, bf16=args.bf16,
    train_sampling_strategy="group_by_length" if args.group_by_length else "random",
)
trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=dev,
                  data_collator=collate, compute_metrics=accuracy)
start = time.perf_counter()
trainer.train()
train_seconds = time.perf_counter() - start
train_padding = 1 - padding["real"] / padding["total"]
result = trainer.evaluate()
print(json.dumps({"train_seconds": train_seconds, "accuracy": result["eval_accuracy"],
                  "padding_fraction": train_padding}))
