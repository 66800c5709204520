"""ResourceManager: the registry of TaskManagers and their slots (Flink's ResourceManager and
SlotManager). It detects lost TaskManagers, allocates slots first come first served, keeps a
pending queue and fails requests that wait longer than `slot_request_timeout_s`."""
