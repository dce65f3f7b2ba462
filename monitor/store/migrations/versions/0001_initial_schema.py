"""Initial schema: peers, models, polls and their raw rows, probes, chat outcomes, scores, hourly rollups.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

Written once from the models, then kept as is: later changes are new revisions. (chat_outcomes.error
arrives in 0002.)
"""

from alembic import op
import sqlalchemy as sa

# BIGINT ids on PostgreSQL; INTEGER PRIMARY KEY (the rowid) on SQLite.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('hourly_block_coverage',
    sa.Column('model', sa.String(), nullable=False),
    sa.Column('hour', sa.Float(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('min_servers', sa.JSON(), nullable=True),
    sa.Column('mean_servers', sa.JSON(), nullable=True),
    sa.Column('min_throughput', sa.JSON(), nullable=True),
    sa.Column('mean_throughput', sa.JSON(), nullable=True),
    sa.PrimaryKeyConstraint('model', 'hour', name=op.f('pk_hourly_block_coverage'))
    )
    op.create_table('hourly_model_status',
    sa.Column('model', sa.String(), nullable=False),
    sa.Column('hour', sa.Float(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('states', sa.JSON(), nullable=True),
    sa.Column('worst_state', sa.String(), nullable=False),
    sa.Column('reasons', sa.JSON(), nullable=True),
    sa.Column('mean_coverage_pct', sa.Float(), nullable=True),
    sa.Column('mean_servers_online', sa.Float(), nullable=True),
    sa.Column('min_redundancy', sa.Integer(), nullable=True),
    sa.Column('mean_tokens_per_s', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('model', 'hour', name=op.f('pk_hourly_model_status'))
    )
    op.create_table('hourly_polls',
    sa.Column('hour', sa.Float(), nullable=False),
    sa.Column('polls', sa.Integer(), nullable=False),
    sa.Column('ok_polls', sa.Integer(), nullable=False),
    sa.Column('mean_duration', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('hour', name=op.f('pk_hourly_polls'))
    )
    op.create_table('model_state_changes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('model', sa.String(), nullable=False),
    sa.Column('from_state', sa.String(), nullable=True),
    sa.Column('to_state', sa.String(), nullable=False),
    sa.Column('reasons', sa.JSON(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model_state_changes'))
    )
    op.create_index(op.f('ix_model_state_changes_model_at'), 'model_state_changes', ['model', 'at'])

    op.create_table('models',
    sa.Column('dht_prefix', sa.String(), nullable=False),
    sa.Column('num_blocks', sa.Integer(), nullable=False),
    sa.Column('repository', sa.String(), nullable=True),
    sa.Column('name', sa.String(), nullable=True),
    sa.Column('official', sa.Boolean(), nullable=False),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.Column('last_seen', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('dht_prefix', name=op.f('pk_models'))
    )
    op.create_table('peers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('peer_id', sa.String(), nullable=False),
    sa.Column('first_seen', sa.Float(), nullable=True),
    sa.Column('last_seen', sa.Float(), nullable=True),
    sa.Column('public_name', sa.String(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_peers')),
    sa.UniqueConstraint('peer_id', name=op.f('uq_peers_peer_id'))
    )
    op.create_table('polls',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('duration', sa.Float(), nullable=False),
    sa.Column('n_models', sa.Integer(), nullable=False),
    sa.Column('n_servers', sa.Integer(), nullable=False),
    sa.Column('invalid_records', sa.Integer(), nullable=False),
    sa.Column('errors', sa.JSON(), nullable=True),
    sa.Column('models', sa.JSON(), nullable=True),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_polls'))
    )
    op.create_index(op.f('ix_polls_at'), 'polls', ['at'])

    op.create_table('store_meta',
    sa.Column('key', sa.String(), nullable=False),
    sa.Column('value', sa.String(), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_store_meta'))
    )
    op.create_table('block_coverage',
    sa.Column('poll_id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('servers', sa.JSON(), nullable=True),
    sa.Column('throughput', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['poll_id'], ['polls.id'], name=op.f('fk_block_coverage_poll_id_polls')),
    sa.PrimaryKeyConstraint('poll_id', 'model', name=op.f('pk_block_coverage'))
    )
    op.create_index(op.f('ix_block_coverage_model_at'), 'block_coverage', ['model', 'at'])

    op.create_table('chat_outcomes',
    sa.Column('id', BIG_ID, nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('peer', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(), nullable=False),
    sa.Column('start', sa.Integer(), nullable=False),
    sa.Column('end', sa.Integer(), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('seconds_per_token', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['peer'], ['peers.id'], name=op.f('fk_chat_outcomes_peer_peers')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_chat_outcomes'))
    )
    op.create_index(op.f('ix_chat_outcomes_at'), 'chat_outcomes', ['at'])
    op.create_index(op.f('ix_chat_outcomes_peer_at'), 'chat_outcomes', ['peer', 'at'])

    op.create_table('hourly_observations',
    sa.Column('peer', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(), nullable=False),
    sa.Column('hour', sa.Float(), nullable=False),
    sa.Column('polls', sa.Integer(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('online', sa.Integer(), nullable=False),
    sa.Column('joining', sa.Integer(), nullable=False),
    sa.Column('mean_throughput', sa.Float(), nullable=True),
    sa.Column('mean_inference_rps', sa.Float(), nullable=True),
    sa.Column('min_start', sa.Integer(), nullable=True),
    sa.Column('max_end', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['peer'], ['peers.id'], name=op.f('fk_hourly_observations_peer_peers')),
    sa.PrimaryKeyConstraint('peer', 'model', 'hour', name=op.f('pk_hourly_observations'))
    )
    op.create_table('hourly_probes',
    sa.Column('peer', sa.Integer(), nullable=False),
    sa.Column('hour', sa.Float(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('ok', sa.Integer(), nullable=False),
    sa.Column('joining', sa.Integer(), nullable=False),
    sa.Column('mean_rtt', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['peer'], ['peers.id'], name=op.f('fk_hourly_probes_peer_peers')),
    sa.PrimaryKeyConstraint('peer', 'hour', name=op.f('pk_hourly_probes'))
    )
    op.create_table('latest_probes',
    sa.Column('peer', sa.Integer(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('kind', sa.String(), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('rtt', sa.Float(), nullable=True),
    sa.Column('error', sa.String(), nullable=True),
    sa.Column('joining', sa.Boolean(), nullable=False),
    sa.Column('address', sa.String(), nullable=True),
    sa.ForeignKeyConstraint(['peer'], ['peers.id'], name=op.f('fk_latest_probes_peer_peers')),
    sa.PrimaryKeyConstraint('peer', name=op.f('pk_latest_probes'))
    )
    op.create_table('model_status',
    sa.Column('id', BIG_ID, nullable=False),
    sa.Column('poll_id', sa.Integer(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('model', sa.String(), nullable=False),
    sa.Column('state', sa.String(), nullable=False),
    sa.Column('reasons', sa.JSON(), nullable=True),
    sa.Column('coverage_pct', sa.Float(), nullable=True),
    sa.Column('servers_online', sa.Integer(), nullable=True),
    sa.Column('min_redundancy', sa.Integer(), nullable=True),
    sa.Column('est_tokens_per_s', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['poll_id'], ['polls.id'], name=op.f('fk_model_status_poll_id_polls')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model_status'))
    )
    op.create_index(op.f('ix_model_status_model_at'), 'model_status', ['model', 'at'])
    op.create_index(op.f('ix_model_status_poll_id'), 'model_status', ['poll_id'])

    op.create_table('peer_scores',
    sa.Column('peer', sa.Integer(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('score', sa.Float(), nullable=False),
    sa.Column('explanation', sa.JSON(), nullable=True),
    sa.Column('components', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['peer'], ['peers.id'], name=op.f('fk_peer_scores_peer_peers')),
    sa.PrimaryKeyConstraint('peer', name=op.f('pk_peer_scores'))
    )
    op.create_table('probe_results',
    sa.Column('id', BIG_ID, nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('peer', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('rtt', sa.Float(), nullable=True),
    sa.Column('error', sa.String(), nullable=True),
    sa.Column('joining', sa.Boolean(), nullable=False),
    sa.Column('address', sa.String(), nullable=True),
    sa.ForeignKeyConstraint(['peer'], ['peers.id'], name=op.f('fk_probe_results_peer_peers')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_probe_results'))
    )
    op.create_index(op.f('ix_probe_results_at'), 'probe_results', ['at'])
    op.create_index(op.f('ix_probe_results_peer_at'), 'probe_results', ['peer', 'at'])

    op.create_table('server_observations',
    sa.Column('id', BIG_ID, nullable=False),
    sa.Column('poll_id', sa.Integer(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('model', sa.String(), nullable=False),
    sa.Column('peer', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(), nullable=False),
    sa.Column('start', sa.Integer(), nullable=False),
    sa.Column('end', sa.Integer(), nullable=False),
    sa.Column('throughput', sa.Float(), nullable=True),
    sa.Column('inference_rps', sa.Float(), nullable=True),
    sa.Column('forward_rps', sa.Float(), nullable=True),
    sa.Column('network_rps', sa.Float(), nullable=True),
    sa.Column('cache_tokens_left', sa.BigInteger(), nullable=True),
    sa.Column('version', sa.String(), nullable=True),
    sa.Column('torch_dtype', sa.String(), nullable=True),
    sa.Column('quant_type', sa.String(), nullable=True),
    sa.Column('using_relay', sa.Boolean(), nullable=True),
    sa.Column('public_name', sa.String(), nullable=True),
    sa.Column('adapters', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['peer'], ['peers.id'], name=op.f('fk_server_observations_peer_peers')),
    sa.ForeignKeyConstraint(['poll_id'], ['polls.id'], name=op.f('fk_server_observations_poll_id_polls')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_server_observations'))
    )
    op.create_index(op.f('ix_server_observations_peer_at'), 'server_observations', ['peer', 'at'])
    op.create_index(op.f('ix_server_observations_poll_id'), 'server_observations', ['poll_id'])

    op.create_table('server_pings',
    sa.Column('id', BIG_ID, nullable=False),
    sa.Column('poll_id', sa.Integer(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('peer', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(), nullable=False),
    sa.Column('next_pings', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['peer'], ['peers.id'], name=op.f('fk_server_pings_peer_peers')),
    sa.ForeignKeyConstraint(['poll_id'], ['polls.id'], name=op.f('fk_server_pings_poll_id_polls')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_server_pings'))
    )
    op.create_index(op.f('ix_server_pings_poll_id'), 'server_pings', ['poll_id'])



def downgrade() -> None:
    op.drop_index(op.f('ix_server_pings_poll_id'), table_name='server_pings')

    op.drop_table('server_pings')
    op.drop_index(op.f('ix_server_observations_poll_id'), table_name='server_observations')
    op.drop_index(op.f('ix_server_observations_peer_at'), table_name='server_observations')

    op.drop_table('server_observations')
    op.drop_index(op.f('ix_probe_results_peer_at'), table_name='probe_results')
    op.drop_index(op.f('ix_probe_results_at'), table_name='probe_results')

    op.drop_table('probe_results')
    op.drop_table('peer_scores')
    op.drop_index(op.f('ix_model_status_poll_id'), table_name='model_status')
    op.drop_index(op.f('ix_model_status_model_at'), table_name='model_status')

    op.drop_table('model_status')
    op.drop_table('latest_probes')
    op.drop_table('hourly_probes')
    op.drop_table('hourly_observations')
    op.drop_index(op.f('ix_chat_outcomes_peer_at'), table_name='chat_outcomes')
    op.drop_index(op.f('ix_chat_outcomes_at'), table_name='chat_outcomes')

    op.drop_table('chat_outcomes')
    op.drop_index(op.f('ix_block_coverage_model_at'), table_name='block_coverage')

    op.drop_table('block_coverage')
    op.drop_table('store_meta')
    op.drop_index(op.f('ix_polls_at'), table_name='polls')

    op.drop_table('polls')
    op.drop_table('peers')
    op.drop_table('models')
    op.drop_index(op.f('ix_model_state_changes_model_at'), table_name='model_state_changes')

    op.drop_table('model_state_changes')
    op.drop_table('hourly_polls')
    op.drop_table('hourly_model_status')
    op.drop_table('hourly_block_coverage')
