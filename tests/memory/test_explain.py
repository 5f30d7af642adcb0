"""Why memory ran out: the figures read from each backend's out-of-memory message, and the lines shown."""

from keras_gpu_tools.memory.explain import OOMExplanation, explanation_of, fragmentation_note, parse_message

GiB = 2**30

# GPU messages in the frameworks' wording (TensorFlow's BFC allocator, XLA's buffer assignment, torch's
# caching allocator); benchmarks/oom_gpu_proof.py checks the parsing against real ones on a GPU. The CPU
# allocators' messages come from real errors in tests/callbacks/test_oom_batch_size_reducer.py.
TF_GPU = (
    "OOM when allocating tensor with shape[262144,65536] and type float on "
    "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n"
    "\t [[{{node sequential_1/dense_1/MatMul}}]]\n"
    "Hint: If you want to see a list of allocated tensors when OOM happens, add report_tensor_allocations_upon_oom"
)
XLA_GPU = """RESOURCE_EXHAUSTED: Out of memory while trying to allocate 68719476736 bytes.
BufferAssignment OOM Debugging.
BufferAssignment stats:
             parameter allocation:   16.06MiB
              constant allocation:         0B
        maybe_live_out allocation:   16.06MiB
     preallocated temp allocation:   64.00GiB
                 total allocation:   64.03GiB
Peak buffers:
	Buffer 1:
		Size: 64.00GiB
		Operator: op_name="jit(train_step)/jit(main)/dot_general" source_file="model.py" source_line=12
		XLA Label: custom-call
		Shape: f32[262144,65536]
		==========================
	Buffer 2:
		Size: 16.00MiB
		XLA Label: parameter
		Shape: f32[64,65536]
		==========================
"""
TORCH_CUDA = (
    "CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
    "12.10 GiB is free. Including non-PyTorch memory, this process has 127.70 GiB memory in use. Of the "
    "allocated memory 120.00 GiB is allocated by PyTorch, and 6.00 GiB is reserved by PyTorch but unallocated."
)


def test_tensorflow_names_the_op_the_shape_and_the_device():
    e = OOMExplanation()
    e.merge(parse_message(TF_GPU))
    assert e.requested_bytes == 262144 * 65536 * 4 and e.shape == (262144, 65536) and e.dtype == "float"
    assert e.allocation == "sequential_1/dense_1/MatMul" and e.device == "GPU:0"
    assert e.lines()[0] == "asked 64.0 GiB for sequential_1/dense_1/MatMul (262144 x 65536 float); on GPU:0"


def test_xla_gives_the_bytes_the_peak_buffers_and_the_buffer_assignment():
    e = OOMExplanation()
    e.merge(parse_message(XLA_GPU))
    assert e.requested_bytes == 68719476736
    assert e.largest[0] == ("jit(train_step)/jit(main)/dot_general f32[262144,65536]", 64 * GiB)
    assert e.program == {"arguments": round(16.06 * 2**20), "outputs": round(16.06 * 2**20), "temporaries": 64 * GiB}
    lines = e.lines()
    assert lines[0] == "asked 64.0 GiB for jit(train_step)/jit(main)/dot_general"
    assert "temporaries 64.0 GiB" in lines[1] and "the largest buffers: jit(train_step)" in lines[2]
    cpu = parse_message("INTERNAL: Error dispatching computation: Out of memory allocating 17592186044416 bytes.")
    assert cpu["requested_bytes"] == 17592186044416


def test_torch_gives_what_was_asked_free_capacity_and_the_cache():
    e = explanation_of(RuntimeError(TORCH_CUDA), peak_bytes=125 * GiB)
    assert e.requested_bytes == 32 * GiB and e.capacity_bytes == round(139.81 * GiB)
    assert e.free_bytes == round(12.10 * GiB) and e.in_use_bytes == 120 * GiB and e.reserved_bytes == 6 * GiB
    assert e.device == "GPU 0" and e.peak_bytes == 125 * GiB
    assert e.lines() == [
        "asked 32.0 GiB; 12.1 GiB free of 139.8 GiB; on GPU 0",
        "allocator: in use 120.0 GiB, peak 125.0 GiB, reserved but unallocated 6.0 GiB",
    ]
    cpu = parse_message("DefaultCPUAllocator: can't allocate memory: you tried to allocate 17592186044416 bytes.")
    assert cpu["requested_bytes"] == 17592186044416 and cpu["device"] == "CPU"


def test_the_message_comes_first_and_the_allocator_fills_the_rest():
    err = MemoryError("OOMBatchSizeReducer: ...")
    err.oom_original = RuntimeError(TORCH_CUDA)  # the backend's error the final one was rebuilt from
    e = explanation_of(err, free_bytes=1, largest=[("block at model.py:3 (call)", 2 * GiB)])
    assert e.free_bytes == round(12.10 * GiB)  # the message's figure is kept
    assert e.largest == [("block at model.py:3 (call)", 2 * GiB)]
    assert OOMExplanation.from_dict(e.as_dict()) == e  # what the report reads back from the log directory


def test_an_unknown_message_gives_no_figures():
    assert parse_message("something else went wrong") == {}
    assert OOMExplanation().lines() == []


def test_torch_fragmentation_is_named_with_what_to_set():
    # The H100 case: 16 GiB asked, 14.3 GiB free, 32 GiB cached but unallocated.
    note = fragmentation_note(16 * GiB, round(14.3 * GiB), 32 * GiB, expandable=False)
    assert note.startswith("fragmented: 32.0 GiB reserved but unallocated and 14.3 GiB free")
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in note
    assert fragmentation_note(16 * GiB, round(14.3 * GiB), 32 * GiB, expandable=True) is None  # already set
    assert fragmentation_note(64 * GiB, round(14.4 * GiB), 2 * 2**20, expandable=False) is None  # too little anyway
    assert fragmentation_note(None, 1, 1, expandable=False) is None
    e = OOMExplanation(notes=[note])
    assert e.lines() == [note]
