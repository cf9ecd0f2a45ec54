"""The one reader of lists typed as text."""

import pytest

from core.lists import comma_ints, comma_names


def test_items_split_on_commas_semicolons_and_spaces():
    assert comma_ints("256, 1024;4096  8192,") == [256, 1024, 4096, 8192]
    assert comma_names(" piqa,arc_easy  hellaswag ") == ["piqa", "arc_easy", "hellaswag"]
    assert comma_ints("") == [] and comma_names(" , ") == []


def test_a_non_number_is_refused_naming_the_list_and_the_text():
    with pytest.raises(ValueError, match=r"^--lengths takes whole numbers separated by commas, such as 256,1024; "
                                         r"got '1k,2k'$"):
        comma_ints("1k,2k", "--lengths")
