"""Generation spread over every process of a run, gathered in input order."""

from __future__ import annotations

from hftoolkit.job.spec import Job


def generate_everywhere(form, job: Job, model, processor, inputs: list, **options) -> list[dict]:
    """form.generate over `inputs`, each input generated once; every process gets all outputs, in order.

    Under DDP every process holds the whole model, so each generates a contiguous share and the
    shares are gathered: N processes finish in 1/N of the time, and none sits in a collective
    while the main process generates alone (gloo and NCCL give up on a wait after 30 and 10
    minutes, which a long generation eval can exceed). Under FSDP and ZeRO-3 a forward pass needs
    every process (each holds a slice of every weight), so there (`job.shards_parameters`) all processes generate all
    inputs in step, with identical results.
    """
    from accelerate import PartialState

    state = PartialState()
    if state.num_processes == 1 or job.shards_parameters:
        return form.generate(job, model, processor, inputs, **options) if len(inputs) else []
    from accelerate.utils import gather_object

    with state.split_between_processes(list(inputs)) as share:
        outputs = form.generate(job, model, processor, share, **options) if len(share) else []
    return gather_object(outputs)
