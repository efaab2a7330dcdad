package sagadef_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// Trip booking contract: message full names.
const (
	tBookTrip      = "travel.v1.BookTrip"
	tOpenFile      = "travel.v1.OpenFile"
	tFileOpened    = "travel.v1.FileOpened"
	tCloseFile     = "travel.v1.CloseFile"
	tFileClosed    = "travel.v1.FileClosed"
	tReserveFlight = "travel.v1.ReserveFlight"
	tFlightHeld    = "travel.v1.FlightReserved"
	tFlightFull    = "travel.v1.FlightFull"
	tCancelFlight  = "travel.v1.CancelFlight"
	tFlightFreed   = "travel.v1.FlightCancelled"
	tReserveHotel  = "travel.v1.ReserveHotel"
	tHotelHeld     = "travel.v1.HotelReserved"
	tHotelFull     = "travel.v1.HotelFull"
	tCancelHotel   = "travel.v1.CancelHotel"
	tHotelFreed    = "travel.v1.HotelCancelled"
	tReserveCar    = "travel.v1.ReserveCar"
	tCarHeld       = "travel.v1.CarReserved"
	tNoCar         = "travel.v1.NoCar"
	tCancelCar     = "travel.v1.CancelCar"
	tCarFreed      = "travel.v1.CarCancelled"
	tPay           = "travel.v1.Pay"
	tPaid          = "travel.v1.Paid"
	tDeclined      = "travel.v1.Declined"
	tCancelTrip    = "travel.v1.CancelTrip"
)

var tripTypes = func() map[string]*message.Info {
	out := map[string]*message.Info{}
	for _, n := range []string{tBookTrip, tCancelTrip, tOpenFile, tCloseFile, tReserveFlight, tCancelFlight, tReserveHotel,
		tCancelHotel, tReserveCar, tCancelCar, tPay} {
		out[n] = sagatest.NewType(n, message.KindCommand)
	}
	for _, n := range []string{tFileOpened, tFileClosed, tFlightHeld, tFlightFull, tFlightFreed, tHotelHeld, tHotelFull,
		tHotelFreed, tCarHeld, tNoCar, tCarFreed, tPaid, tDeclined} {
		out[n] = sagatest.NewType(n, message.KindReply)
	}
	return out
}()

func tripMsg(name string) message.Message { return sagatest.NewMessage(tripTypes[name], "trip-1") }

func tripHooks() sagadef.Hooks {
	all := make([]*message.Info, 0, len(tripTypes))
	for _, t := range tripTypes {
		all = append(all, t)
	}
	return sagatest.Hooks(all...)
}

// bookTrip returns an uncompiled trip booking definition: OpenFile
// (compensatable), the group ReserveTrip of ReserveFlight, ReserveHotel and
// ReserveCar (compensatable; the flight retries on timeout), then Pay (the
// pivot).
func bookTrip(mods ...func(*sagadef.Definition)) *sagadef.Definition {
	member := func(name, cmd, ok, fail, comp, compOK string) sagadef.Step {
		return sagadef.Step{
			Name: name, Role: sagadef.RoleCompensatable, Group: "ReserveTrip",
			Command: cmd, SuccessReplies: []string{ok}, FailureReplies: []string{fail},
			Compensation: comp, CompensationReply: compOK,
			Timeout: time.Minute, OnTimeout: sagadef.TimeoutCompensate, MaxAttempts: 2, Late: sagadef.LateIgnore,
		}
	}
	flight := member("ReserveFlight", tReserveFlight, tFlightHeld, tFlightFull, tCancelFlight, tFlightFreed)
	flight.OnTimeout, flight.Timeout = sagadef.TimeoutRetry, 30*time.Second
	hotel := member("ReserveHotel", tReserveHotel, tHotelHeld, tHotelFull, tCancelHotel, tHotelFreed)
	hotel.Late = sagadef.LateManualReview
	d := &sagadef.Definition{
		Name: "travel.v1.BookTripSaga", Table: "saga_book_trip", StartMessage: tBookTrip,
		Deadline: time.Hour,
		Groups:   []sagadef.Group{{Name: "ReserveTrip", Timeout: 2 * time.Minute}},
		Steps: []sagadef.Step{
			{
				Name: "OpenFile", Role: sagadef.RoleCompensatable, Command: tOpenFile,
				SuccessReplies: []string{tFileOpened}, Compensation: tCloseFile, CompensationReply: tFileClosed,
				Timeout: time.Minute, OnTimeout: sagadef.TimeoutCompensate, Late: sagadef.LateIgnore,
			},
			flight,
			hotel,
			member("ReserveCar", tReserveCar, tCarHeld, tNoCar, tCancelCar, tCarFreed),
			{
				Name: "Pay", Role: sagadef.RolePivot, Command: tPay,
				SuccessReplies: []string{tPaid}, FailureReplies: []string{tDeclined},
				Timeout: time.Minute, OnTimeout: sagadef.TimeoutManualReview, Late: sagadef.LateManualReview,
			},
		},
	}
	for _, m := range mods {
		m(d)
	}
	return d
}

// emitted returns the full names of the messages a result sends.
func emitted(res sagadef.Result) []string {
	var out []string
	for _, o := range res.Emit {
		out = append(out, o.Message.SagaMessageInfo().FullName)
	}
	return out
}

// startTrip starts a trip saga and brings it into its group.
func startTrip(t *testing.T, d *sagadef.Definition) *sagatest.Harness {
	t.Helper()
	h := sagatest.New(t, compiled(t, d), tripHooks())
	h.Start(tripMsg(tBookTrip))
	res := h.Reply(tripMsg(tFileOpened))
	require.Equal(t, "RESERVE_TRIP", res.To)
	require.Equal(t, []string{tReserveFlight, tReserveHotel, tReserveCar}, emitted(res), "entering the group sends every member's command in one transition")
	return h
}

func TestGroupStates(t *testing.T) {
	t.Parallel()
	d := compiled(t, bookTrip())
	var names []string
	for _, s := range d.States {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"OPEN_FILE", "RESERVE_TRIP", "PAY", "COMPENSATING_RESERVE_CAR", "COMPENSATING_RESERVE_HOTEL",
		"COMPENSATING_RESERVE_FLIGHT", "COMPENSATING_OPEN_FILE", "MANUAL_REVIEW", "COMPLETED", "FAILED", "CANCELLED"}, names)
	st, ok := d.LookupState("RESERVE_TRIP")
	require.True(t, ok)
	require.Equal(t, sagadef.State{Name: "RESERVE_TRIP", Kind: sagadef.StateKindGroup, Group: "ReserveTrip"}, st)
	require.Equal(t, []string{"ReserveFlight", "ReserveHotel", "ReserveCar"}, d.Members("ReserveTrip"))
	g, ok := d.GroupOf("ReserveHotel")
	require.True(t, ok)
	require.Equal(t, "ReserveTrip", g.Name)
	_, ok = d.GroupOf("Pay")
	require.False(t, ok)
}

func TestGroupJoinsWhenEveryMemberSucceeds(t *testing.T) {
	t.Parallel()
	h := startTrip(t, bookTrip())
	inst := h.Instance()
	require.Empty(t, inst.PendingMessageID)
	require.Len(t, inst.Progress.Group.Members, 3)
	require.Equal(t, sagatest.Epoch.Add(30*time.Second), inst.TimeoutAt, "the earliest timer: the flight's")

	res := h.ReplyFor("ReserveHotel", tripMsg(tHotelHeld))
	require.Equal(t, sagadef.ClassNew, res.Class)
	require.Equal(t, "RESERVE_TRIP", res.To)
	require.Empty(t, res.Emit)
	// The hotel's reply again: a duplicate, whatever its message id.
	h.Duplicate()
	h.RequireClass(sagadef.ClassDuplicate)
	h.ReplyFor("ReserveCar", tripMsg(tCarHeld))
	h.RequireState("RESERVE_TRIP")
	res = h.ReplyFor("ReserveFlight", tripMsg(tFlightHeld))
	require.Equal(t, "PAY", res.To, "the last member's success joins the group")
	require.Equal(t, []string{tPay}, emitted(res))
	require.Nil(t, res.Instance.Progress.Group)
	require.Equal(t, []string{"OpenFile", "ReserveHotel", "ReserveCar", "ReserveFlight"}, res.Instance.Progress.Completed)
	h.Reply(tripMsg(tPaid))
	h.RequireState(sagadef.StateCompleted)
}

func TestGroupMemberFailureCompensatesInReverse(t *testing.T) {
	t.Parallel()
	h := startTrip(t, bookTrip())
	carCmd := h.PendingFor("ReserveCar")
	h.ReplyFor("ReserveHotel", tripMsg(tHotelHeld))
	res := h.ReplyFor("ReserveFlight", tripMsg(tFlightFull))
	// The car still waits: it stops, and is compensated (its effect may
	// have happened) before the hotel; the flight failed: nothing to undo.
	require.Equal(t, "COMPENSATING_RESERVE_CAR", res.To)
	require.Equal(t, []string{tCancelCar}, emitted(res))
	require.Equal(t, []string{"ReserveCar"}, res.Instance.Progress.Stopped)
	require.Nil(t, res.Instance.Progress.Group)
	require.NotEmpty(t, res.Emit[0].Compensates, "the compensation names the stopped member's command")

	// The stopped car's late success: audited (late policy ignore), its
	// compensation was sent naming the command.
	res = h.ReplyTo(carCmd, tripMsg(tCarHeld))
	require.Equal(t, sagadef.ClassLate, res.Class)
	require.Equal(t, "COMPENSATING_RESERVE_CAR", res.To)

	h.Reply(tripMsg(tCarFreed))
	h.RequireState("COMPENSATING_RESERVE_HOTEL")
	h.Reply(tripMsg(tHotelFreed))
	h.RequireState("COMPENSATING_OPEN_FILE")
	h.Reply(tripMsg(tFileClosed))
	h.RequireState(sagadef.StateFailed)
}

func TestGroupStoppedMemberLateSuccessFollowsItsPolicy(t *testing.T) {
	t.Parallel()
	h := startTrip(t, bookTrip())
	hotelCmd := h.PendingFor("ReserveHotel")
	h.ReplyFor("ReserveCar", tripMsg(tNoCar))
	h.RequireState("COMPENSATING_RESERVE_HOTEL")
	// The hotel (late policy manual review) answers after it stopped and
	// after its compensation was sent: a human checks.
	res := h.ReplyTo(hotelCmd, tripMsg(tHotelHeld))
	require.Equal(t, sagadef.ClassLate, res.Class)
	require.Equal(t, sagadef.StateManualReview, res.To)
}

func TestGroupMemberTimeoutRetriesOnlyItsCommand(t *testing.T) {
	t.Parallel()
	h := startTrip(t, bookTrip(func(d *sagadef.Definition) { d.Steps[1].MaxAttempts = 3 }))
	first := h.PendingFor("ReserveFlight")
	hotel := h.PendingFor("ReserveHotel")
	res := h.Timeout()
	require.Equal(t, sagadef.ClassNew, res.Class)
	require.Equal(t, "RESERVE_TRIP", res.To)
	require.Equal(t, []string{tReserveFlight}, emitted(res), "only the flight's command is resent")
	require.NotEqual(t, first, h.PendingFor("ReserveFlight"))
	require.Equal(t, hotel, h.PendingFor("ReserveHotel"), "the other members keep waiting on their first command")

	// The answer to the flight's first attempt: late (ignore) while the
	// flight waits on its second.
	res = h.ReplyTo(first, tripMsg(tFlightHeld))
	require.Equal(t, sagadef.ClassLate, res.Class)
	h.RequireState("RESERVE_TRIP")

	// Next due: the hotel's and the car's own timeouts (compensate): the
	// hotel, first in contract order, stops the group.
	res = h.Timeout()
	require.Equal(t, "COMPENSATING_RESERVE_CAR", res.To)
	require.ElementsMatch(t, []string{"ReserveFlight", "ReserveHotel", "ReserveCar"}, res.Instance.Progress.Stopped)
	require.Contains(t, res.Instance.LastError, "ReserveHotel timed out")
}

func TestGroupTimeoutCompensatesEveryMember(t *testing.T) {
	t.Parallel()
	// Members that retry until the group's own timeout fires first.
	h := startTrip(t, bookTrip(func(d *sagadef.Definition) {
		for i := 1; i <= 3; i++ {
			d.Steps[i].OnTimeout, d.Steps[i].Timeout, d.Steps[i].MaxAttempts = sagadef.TimeoutRetry, time.Minute, 5
		}
	}))
	h.ReplyFor("ReserveFlight", tripMsg(tFlightHeld))
	h.Advance(2*time.Minute + time.Second)
	res := h.Timeout()
	require.Equal(t, "COMPENSATING_RESERVE_CAR", res.To)
	require.Contains(t, res.Instance.LastError, "group ReserveTrip timed out")
	for _, want := range []string{"COMPENSATING_RESERVE_HOTEL", "COMPENSATING_RESERVE_FLIGHT", "COMPENSATING_OPEN_FILE", sagadef.StateFailed} {
		h.Reply(tripMsg(map[string]string{
			"COMPENSATING_RESERVE_CAR": tCarFreed, "COMPENSATING_RESERVE_HOTEL": tHotelFreed,
			"COMPENSATING_RESERVE_FLIGHT": tFlightFreed, "COMPENSATING_OPEN_FILE": tFileClosed,
		}[h.Instance().State]))
		h.RequireState(want)
	}
}

func TestGroupReviewAndOperatorRetry(t *testing.T) {
	t.Parallel()
	h := startTrip(t, bookTrip())
	h.ReplyFor("ReserveFlight", tripMsg(tFlightHeld))
	carCmd := h.PendingFor("ReserveCar")
	h.Deadline()
	h.RequireState(sagadef.StateManualReview)
	// In review, the car's success is recorded; the operator's retry
	// resends only the hotel's command.
	res := h.ReplyTo(carCmd, tripMsg(tCarHeld))
	require.Equal(t, sagadef.ClassLate, res.Class)
	res = h.OperatorRetry("hotel was slow")
	require.Equal(t, "RESERVE_TRIP", res.To)
	require.Equal(t, []string{tReserveHotel}, emitted(res))
	res = h.ReplyFor("ReserveHotel", tripMsg(tHotelHeld))
	require.Equal(t, "PAY", res.To)
}

func TestGroupCancelAndOperatorCompensate(t *testing.T) {
	t.Parallel()
	h := startTrip(t, bookTrip(func(d *sagadef.Definition) { d.Cancel = sagadef.Cancel{Message: tCancelTrip} }))
	h.ReplyFor("ReserveHotel", tripMsg(tHotelHeld))
	res := h.Cancel(tripMsg(tCancelTrip))
	require.Equal(t, "COMPENSATING_RESERVE_CAR", res.To)
	for h.Instance().State != sagadef.StateCancelled {
		h.Reply(tripMsg(map[string]string{
			"COMPENSATING_RESERVE_CAR": tCarFreed, "COMPENSATING_RESERVE_HOTEL": tHotelFreed,
			"COMPENSATING_RESERVE_FLIGHT": tFlightFreed, "COMPENSATING_OPEN_FILE": tFileClosed,
		}[h.Instance().State]))
	}
	require.Equal(t, []string{"ReserveCar", "ReserveHotel", "ReserveFlight", "OpenFile"}, h.Instance().Progress.Compensated)

	h = startTrip(t, bookTrip())
	res = h.OperatorCompensate("customer called")
	require.Equal(t, "COMPENSATING_RESERVE_CAR", res.To)
}

func TestGroupTableRows(t *testing.T) {
	t.Parallel()
	d := compiled(t, bookTrip())
	rows := map[string]bool{}
	for _, r := range d.Transitions {
		rows[r.From+" --"+r.Trigger+"--> "+r.To+" "+joinShort(r.Emits)] = true
	}
	for _, want := range []string{
		"OPEN_FILE --" + tFileOpened + "--> RESERVE_TRIP ReserveFlight,ReserveHotel,ReserveCar",
		"RESERVE_TRIP --" + tHotelHeld + "--> RESERVE_TRIP ",
		"RESERVE_TRIP --" + tHotelHeld + "--> PAY Pay",
		"RESERVE_TRIP --" + tFlightFull + "--> COMPENSATING_RESERVE_CAR CancelCar",
		"RESERVE_TRIP --" + tNoCar + "--> COMPENSATING_RESERVE_HOTEL CancelHotel",
		"RESERVE_TRIP --timeout--> RESERVE_TRIP ReserveFlight",
		"RESERVE_TRIP --operator.retry--> RESERVE_TRIP ReserveHotel,ReserveCar",
	} {
		require.True(t, rows[want], "missing row %s", want)
	}
	// The car ran whenever another member failed: compensation starts there.
	require.False(t, rows["RESERVE_TRIP --"+tFlightFull+"--> COMPENSATING_RESERVE_HOTEL CancelHotel"])
	require.Contains(t, d.Mermaid(), "RESERVE_TRIP")
}

func joinShort(names []string) string {
	out := ""
	for i, n := range names {
		if i > 0 {
			out += ","
		}
		out += n[len("travel.v1."):]
	}
	return out
}

func TestGroupCompileErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		mod  func(*sagadef.Definition)
		want string
	}{
		"undeclared": {func(d *sagadef.Definition) { d.Groups = nil }, `names group "ReserveTrip", which the saga does not declare`},
		"no timeout": {func(d *sagadef.Definition) { d.Groups[0].Timeout = 0 }, "timeout 0s is not positive"},
		"apart": {func(d *sagadef.Definition) {
			d.Steps[1], d.Steps[0] = d.Steps[0], d.Steps[1]
		}, "whose members are not right before it"},
		"one member": {func(d *sagadef.Definition) { d.Steps[2].Group, d.Steps[3].Group = "", "" }, "has one member"},
		"no members": {func(d *sagadef.Definition) {
			d.Groups = append(d.Groups, sagadef.Group{Name: "Empty", Timeout: time.Minute})
		}, "group Empty: has no members"},
		"step name": {func(d *sagadef.Definition) {
			d.Groups = append(d.Groups, sagadef.Group{Name: "Pay", Timeout: time.Minute})
		}, "has the name of a step"},
		"pivot":       {func(d *sagadef.Definition) { d.Steps[4].Group = "ReserveTrip" }, "the pivot is a member of group ReserveTrip"},
		"conditional": {func(d *sagadef.Definition) { d.Steps[2].Conditional = true }, "conditional step is a member"},
		"twice": {func(d *sagadef.Definition) {
			d.Groups = append(d.Groups, d.Groups[0])
		}, "is declared twice"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := bookTrip(tc.mod).Compile()
			require.Error(t, err)
			require.ErrorContains(t, err, tc.want)
			var de *sagadef.DefinitionError
			require.True(t, errors.As(err, &de))
		})
	}
}
