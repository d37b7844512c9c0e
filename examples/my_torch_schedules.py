"""A user-style torch pipelining schedule that is wrong, for ``distcheck certify --contract pipeline-schedule``.

    distcheck certify torch.distributed.pipelining:ScheduleZBVZeroBubble --contract pipeline-schedule --world-sizes 2,4
    distcheck certify examples.my_torch_schedules:GPipeMeanLoss --contract pipeline-schedule --option schedule=gpipe
"""

from torch.distributed.pipelining import ScheduleGPipe


class GPipeMeanLoss(ScheduleGPipe):
    """Wrong: GPipe that always divides the gradients by the number of micro-batches, even when
    its caller asks for the summed loss (``scale_grads=False``): its table and timeline are
    GPipe's, its gradients are not the unsplit model's."""

    def __init__(self, *args, **kwargs):
        kwargs["scale_grads"] = True
        super().__init__(*args, **kwargs)
