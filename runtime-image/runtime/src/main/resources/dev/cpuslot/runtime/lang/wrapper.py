def __cpuslot_call(a, e, __f=__cpuslot_entry, __environ=__cpuslot_posix.environ):
    for k in [k for k in __environ if k.startswith(b'__OW_')]:
        del __environ[k]
    __environ.update(__cpuslot_env(__cpuslot_loads(e)))
    r = __f(__cpuslot_loads(a))
    return 'null' if r is None else __cpuslot_dumps(r)
