"""spio.memo.remember: a memo that starts over at its limit."""

from spio.memo import remember


def test_a_memo_starts_over_at_its_limit_but_not_for_a_key_it_holds():
    store: dict = {}
    assert [remember(store, key, key * 10, 3) for key in (1, 2, 3)] == [10, 20, 30]
    assert remember(store, 2, 21, 3) == 21 and store == {1: 10, 2: 21, 3: 30}
    assert remember(store, 4, 40, 3) == 40 and store == {4: 40}
