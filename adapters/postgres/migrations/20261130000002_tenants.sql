-- The tenants a cron fan-out reaches (`PgTenantDirectory`), with what their plan entitles
-- them to, e.g. `{"data_freshness": "6h"}`. Paged by id (keyset), so the primary key is the
-- only index needed.

create schema if not exists core;

create table if not exists core.tenants (
    id           uuid  primary key,
    entitlements jsonb not null default '{}',
    -- Entitlements are a name -> value object; anything else cannot be read as one.
    constraint tenants_entitlements_object check (jsonb_typeof(entitlements) = 'object'),
    -- Every id must be a tenant id the envelope accepts (Zod 4's `z.uuid()`: versions 1-8 with
    -- the RFC 9562 variant, or the nil or max UUID), or one bad row would stop every fan-out.
    constraint tenants_id_is_envelope_uuid check (
        id::text ~ '^([0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$'
    )
);
