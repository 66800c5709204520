"""The JobManager reads the latest checkpoint of a batch's jobs once (BatchLatest.prefetch); a
checkpoint completed or discarded later in the same batch must not be answered from that read."""

from services.jobmanager.checkpoint_store import BatchLatest


class CountingStore:
    """An in-memory store that counts single reads."""

    def __init__(self):
        self.pointers: dict[str, dict[int, dict]] = {}
        self.single_reads = 0

    def next_id(self, s, job_id):
        return max(self.pointers.get(job_id, {0: None}), default=0) + 1

    def add(self, s, job_id, checkpoint_id, pointer):
        self.pointers.setdefault(job_id, {})[checkpoint_id] = dict(pointer, id=checkpoint_id)

    def latest(self, s, job_id):
        self.single_reads += 1
        done = self.pointers.get(job_id)
        return done[max(done)] if done else None

    def latest_many(self, s, job_ids):
        return {j: (self.pointers[j][max(self.pointers[j])] if self.pointers.get(j) else None) for j in job_ids}

    def remove(self, s, job_id, checkpoint_id):
        self.pointers.get(job_id, {}).pop(checkpoint_id, None)

    def remove_job(self, s, job_id):
        self.pointers.pop(job_id, None)


def test_prefetched_answers_cost_no_single_read():
    inner = CountingStore()
    inner.add(None, "a", 1, {"path": "/c/a/1"})
    store = BatchLatest(inner)
    store.prefetch(None, ["a", "b"])
    assert store.latest(None, "a")["path"] == "/c/a/1"
    assert store.latest(None, "b") is None
    assert inner.single_reads == 0
    assert store.latest(None, "c") is None and inner.single_reads == 1  # not prefetched: asked


def test_a_checkpoint_completed_in_the_batch_is_seen():
    inner = CountingStore()
    inner.add(None, "a", 1, {"path": "/c/a/1"})
    store = BatchLatest(inner)
    store.prefetch(None, ["a"])
    store.add(None, "a", 2, {"path": "/c/a/2"})
    assert store.latest(None, "a")["path"] == "/c/a/2"


def test_a_checkpoint_discarded_in_the_batch_is_not_restored_from():
    inner = CountingStore()
    inner.add(None, "a", 1, {"path": "/c/a/1"})
    inner.add(None, "a", 2, {"path": "/c/a/2"})
    store = BatchLatest(inner)
    store.prefetch(None, ["a"])
    store.remove(None, "a", 2)
    assert store.latest(None, "a")["path"] == "/c/a/1"
    store.remove_job(None, "a")
    assert store.latest(None, "a") is None


def test_clear_ends_the_batch():
    inner = CountingStore()
    store = BatchLatest(inner)
    store.prefetch(None, ["a"])
    inner.add(None, "a", 1, {"path": "/c/a/1"})  # written outside the batch (another transaction)
    store.clear()
    assert store.latest(None, "a")["path"] == "/c/a/1"


def test_a_store_without_bulk_reads_is_asked_one_by_one():
    class Plain(CountingStore):
        latest_many = None

    inner = Plain()
    store = BatchLatest(inner)
    store.prefetch(None, ["a"])
    assert store.latest(None, "a") is None and inner.single_reads == 1
