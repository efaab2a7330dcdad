package admin_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
	activationv1 "github.com/protosaga/saga/testdata/golden/shapes/activation/v1"
)

// activation decides the Line Activation saga of the shapes contract: its
// group Prepare runs ReserveNumber and ShipSim together; no conditional
// step is skipped.
type activation struct {
	activationv1.ActivationNoopFolds
}

func (activation) Start(_ context.Context, m *activationv1.ActivateLine) (*activationv1.ActivationData, error) {
	return &activationv1.ActivationData{OrderId: m.GetOrderId(), Msisdn: m.GetMsisdn()}, nil
}

func (activation) BuildValidateAddress(_ context.Context, d *activationv1.ActivationData) (*activationv1.ValidateAddress, error) {
	return &activationv1.ValidateAddress{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildReserveNumber(_ context.Context, d *activationv1.ActivationData) (*activationv1.ReserveNumber, error) {
	return &activationv1.ReserveNumber{OrderId: d.GetOrderId(), Msisdn: d.GetMsisdn()}, nil
}

func (activation) BuildReleaseNumber(_ context.Context, d *activationv1.ActivationData) (*activationv1.ReleaseNumber, error) {
	return &activationv1.ReleaseNumber{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildShipSim(_ context.Context, d *activationv1.ActivationData) (*activationv1.ShipSim, error) {
	return &activationv1.ShipSim{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildRecallSim(_ context.Context, d *activationv1.ActivationData) (*activationv1.RecallSim, error) {
	return &activationv1.RecallSim{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildProvisionLine(_ context.Context, d *activationv1.ActivationData) (*activationv1.ProvisionLine, error) {
	return &activationv1.ProvisionLine{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildSendWelcomePack(_ context.Context, d *activationv1.ActivationData) (*activationv1.SendWelcomePack, error) {
	return &activationv1.SendWelcomePack{OrderId: d.GetOrderId()}, nil
}

func (activation) SkipCreditCheck(context.Context, *activationv1.ActivationData) (bool, string, error) {
	return false, "", nil
}

func (activation) SkipSendWelcomePack(context.Context, *activationv1.ActivationData) (bool, string, error) {
	return false, "", nil
}

// setupActivation gives a test its own schema with the Line Activation
// table, an engine on a test clock and an admin server over it.
func setupActivation(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, activationv1.ActivationMigrations()))
	clk := &clock{now: time.Now().UTC().Truncate(time.Second)}
	act, err := activationv1.NewActivation(saga.Config{Pool: pool, Now: clk.Now, Logger: slog.New(slog.DiscardHandler)}, activation{})
	require.NoError(t, err)
	srv, err := admin.New(admin.Config{Pool: pool, Sagas: []*saga.Engine{act.Engine()}, Tokens: tokens,
		Logger: slog.New(slog.DiscardHandler), Now: clk.Now, StuckGrace: -1, MaxFailedSignIns: -1})
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &bundle{pool: pool, engine: act.Engine(), clock: clk, server: srv, http: hs, logs: &testenv.LogBuffer{}}
}

// answer delivers m as the reply to the command causation of saga id.
func (b *bundle) answer(t *testing.T, id, causation string, m message.Message) {
	t.Helper()
	env, err := message.New(m, message.Meta{SagaID: id, SagaType: "shapes.activation.v1.Activation", CausationID: causation})
	require.NoError(t, err)
	require.NoError(t, b.deliver(t, env, m))
}

// TestGroupPosition: while a saga waits on a parallel group, its timeline
// (GET /api/sagas/{id}) names the group and each member still waiting —
// its pending command, attempt, timeout and timeout action — and waits
// for the replies of those members only; the console's saga page lists
// them. A member's reply takes it off the list; the last one's moves the
// saga past the group.
func TestGroupPosition(t *testing.T) {
	t.Parallel()
	b := setupActivation(t)
	ctx := context.Background()
	id, created, err := b.engine.Start(ctx, &activationv1.ActivateLine{OrderId: "act-1", Msisdn: "+491700000001"}, message.Meta{})
	require.NoError(t, err)
	require.True(t, created)
	b.answer(t, id, b.status(t, id).PendingMessageID, &activationv1.AddressValid{OrderId: "act-1"})

	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.Equal(t, "PREPARE", tl.Position.State)
	require.Equal(t, "Prepare", tl.Position.Group)
	require.Len(t, tl.Position.Members, 2)
	byStep := map[string]admin.MemberView{}
	for _, m := range tl.Position.Members {
		byStep[m.Step] = m
		require.NotEmpty(t, m.PendingMessageID, m.Step)
		require.Equal(t, 1, m.Attempt, m.Step)
		require.Positive(t, m.MaxAttempts, m.Step)
		require.NotEmpty(t, m.OnTimeout, m.Step)
		require.True(t, m.TimeoutAt.After(b.clock.Now()), "%s: its timeout is ahead", m.Step)
	}
	require.Contains(t, byStep, "ReserveNumber")
	require.Contains(t, byStep, "ShipSim")
	require.NotEqual(t, byStep["ReserveNumber"].PendingMessageID, byStep["ShipSim"].PendingMessageID, "one command per member")
	require.ElementsMatch(t, []string{"shapes.activation.v1.NumberReserved", "shapes.activation.v1.NumberTaken",
		"shapes.activation.v1.SimShipped", "shapes.activation.v1.SimOutOfStock"}, tl.Position.WaitingFor)
	require.Contains(t, tl.Position.Summary, "group Prepare (ReserveNumber, ShipSim) waits for")
	require.Equal(t, []string{"CreditCheck", "ProvisionLine", "SendWelcomePack"}, tl.Position.Remaining)

	c := openConsole(t, b, readToken)
	c.open("#/saga/"+id, "#group-members")
	var steps []string
	c.eval(`[...document.querySelectorAll("#group-members li.group-member")].map((li) => li.dataset.step)`, &steps)
	require.ElementsMatch(t, []string{"ReserveNumber", "ShipSim"}, steps)
	members := c.text("#group-members")
	containsAll(t, members, byStep["ReserveNumber"].PendingMessageID, byStep["ShipSim"].PendingMessageID, "attempt 1 of", "(group Prepare)")

	// One member answers: only the other still waits.
	b.answer(t, id, byStep["ReserveNumber"].PendingMessageID, &activationv1.NumberReserved{OrderId: "act-1"})
	tl = getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.Equal(t, "Prepare", tl.Position.Group)
	require.Len(t, tl.Position.Members, 1)
	require.Equal(t, "ShipSim", tl.Position.Members[0].Step)
	require.ElementsMatch(t, []string{"shapes.activation.v1.SimShipped", "shapes.activation.v1.SimOutOfStock"}, tl.Position.WaitingFor)
	c.open("#/saga/"+id, "#group-members")
	c.eval(`[...document.querySelectorAll("#group-members li.group-member")].map((li) => li.dataset.step)`, &steps)
	require.Equal(t, []string{"ShipSim"}, steps)

	// The last member answers: the group is joined and the saga moves on.
	b.answer(t, id, byStep["ShipSim"].PendingMessageID, &activationv1.SimShipped{OrderId: "act-1"})
	tl = getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.Equal(t, "CREDIT_CHECK", tl.Position.State)
	require.Empty(t, tl.Position.Group)
	require.Empty(t, tl.Position.Members)
	c.open("#/saga/"+id, "#position-summary")
	require.Zero(t, c.count("#group-members"))
}

// TestTimelineMarksAStepSettledEarly: the External CreditCheck's event,
// recorded while the saga waits on the group before it, settles the step
// in the transition that leaves the group, so no transition ends in
// CREDIT_CHECK; the timeline still marks the state visited.
func TestTimelineMarksAStepSettledEarly(t *testing.T) {
	t.Parallel()
	b := setupActivation(t)
	ctx := context.Background()
	id, _, err := b.engine.Start(ctx, &activationv1.ActivateLine{OrderId: "act-early", Msisdn: "+491700000002"}, message.Meta{})
	require.NoError(t, err)
	b.answer(t, id, b.status(t, id).PendingMessageID, &activationv1.AddressValid{OrderId: "act-early"})
	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.Equal(t, "PREPARE", tl.Position.State)
	members := tl.Position.Members
	require.Len(t, members, 2)

	b.answer(t, id, "", &activationv1.CreditApproved{OrderId: "act-early"})
	require.Equal(t, "PREPARE", b.status(t, id).State, "recorded early, the state unchanged")
	for _, m := range members {
		var reply message.Message = &activationv1.NumberReserved{OrderId: "act-early"}
		if m.Step == "ShipSim" {
			reply = &activationv1.SimShipped{OrderId: "act-early"}
		}
		b.answer(t, id, m.PendingMessageID, reply)
	}
	require.Equal(t, "PROVISION_LINE", b.status(t, id).State, "the early event settled CreditCheck on the way")

	tl = getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	for _, e := range tl.Events {
		if e.Kind == admin.EventTransition {
			require.NotEqual(t, "CREDIT_CHECK", e.To, "no transition ends in the check's state")
		}
	}
	visited := map[string]bool{}
	for _, st := range tl.States {
		visited[st.Name] = st.Visited
	}
	require.True(t, visited["CREDIT_CHECK"], "the step settled early is marked visited")
	require.True(t, visited["PREPARE"])
	require.False(t, visited["SEND_WELCOME_PACK"], "a step not reached is not")
}
