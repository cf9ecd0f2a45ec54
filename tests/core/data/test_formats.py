"""core.data.formats: the Alpaca template and label masking."""

from core.data import IGNORE_INDEX, format_alpaca, tokenize_instruction, tokenize_text


def test_format_alpaca():
    no_input = format_alpaca("Add 2 and 3.")
    assert no_input == (
        "Below is an instruction that describes a task. Write a response that appropriately completes "
        "the request.\n\n### Instruction:\nAdd 2 and 3.\n\n### Response:\n"
    )
    with_input = format_alpaca("Add the numbers.", "2 and 3")
    assert with_input == (
        "Below is an instruction that describes a task, paired with an input that provides further "
        "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
        "Add the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n"
    )
    assert format_alpaca("Add 2 and 3.", "   ") == no_input  # blank input: the no-input template


def test_label_masking(tokenizer):
    (ids, labels), = tokenize_instruction(tokenizer, ["How many eggs?"], [""], ["The answer is 9."])
    prompt_len = len(tokenizer(format_alpaca("How many eggs?"))["input_ids"])
    assert (labels[:prompt_len] == IGNORE_INDEX).all()
    assert (labels[prompt_len:] == ids[prompt_len:]).all()
    assert ids[-1] == tokenizer.eos_token_id and labels[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[:prompt_len]) == format_alpaca("How many eggs?")
    assert tokenizer.decode(labels[prompt_len:-1]) == "The answer is 9."


def test_text_labels_are_ids(tokenizer):
    (ids, labels), = tokenize_text(tokenizer, ["In the beginning."])
    assert (ids == labels).all() and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[:-1]) == "In the beginning."
