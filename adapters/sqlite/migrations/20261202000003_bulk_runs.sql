-- Bulk dead-letter runs (`jobsctl dead-letters replay|discard --all`, the console's bulk
-- actions), journaled in the store so that every console instance and every `jobsctl` see the
-- same runs, their progress, and resume the same unfinished one. A run is the snapshot of the
-- ids it acts on, in order (`ids`, a JSON array of integers: SQLite has no arrays), and one
-- item per letter settled, recorded once. Times are INTEGER Unix milliseconds.
--
-- At most one unfinished run per key (the action and the filter, as the caller describes
-- them): two operators starting the same run at once insert `on conflict do nothing` against
-- the partial unique index, and both then read the one run. Neither table references
-- `dead_letters`: a run's record outlives the letters it names.
create table if not exists bulk_runs (
    -- autoincrement: ids are never reused, so they order the runs, newest last.
    id          integer primary key autoincrement,
    key         text    not null,
    action      text    not null check (action in ('replay', 'discard')),
    ids         text    not null check (json_valid(ids) and json_type(ids) = 'array'),
    "by"        text    not null,
    started_at  integer not null,
    finished_at integer null
) strict;

create unique index if not exists bulk_runs_unfinished_key
    on bulk_runs (key) where finished_at is null;

create table if not exists bulk_run_items (
    run_id    integer not null references bulk_runs (id) on delete cascade,
    letter_id integer not null,
    outcome   text    not null,
    primary key (run_id, letter_id)
) strict;
